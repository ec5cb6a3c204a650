"""The public data sets the tests read at run time (never committed): ``../shared/data`` beside the checkout
(README: Two commands).  ``public_data(name)`` is the path of one file, or a test failure that says where the
data belongs (a missing data set fails the test; it is never skipped)."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def public_data(name: str) -> Path:
    """``DATA / name``; fails the calling test when the file is not there."""
    path = DATA / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: the public data sets (LoCoMo, KdConv) belong in ../shared/data "
                    "beside this checkout (README: Two commands)", pytrace=False)
    return path
