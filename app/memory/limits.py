"""The bounds of one ThreadState (docs/contract.md: ThreadState, Configuration).

Each bound has one default and one minimum, here.  ``MemoryLimits(...)`` itself
does not check the minimums; ``app.settings.Settings`` validates them (through
the ``Ge`` annotations) when the limits come from the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Le


@dataclass(frozen=True)
class MemoryLimits:
    """Bounds of one ThreadState; hashable, so schemas can be cached per value.

    Attributes:
        recent_turns: whole user+assistant turns kept verbatim (default 4 = 8 messages; at least 1).
        summary_max_chars: longest summary, in characters (2500; at least 100).
        pinned_max: most pinned decisions (20; at least 1).
        pinned_max_chars: longest pinned decision, in characters (300; at least 10).
        delivery_final_max_chars: longest delivery-chain final report kept, in characters (8000; at least 200).
        compact_batch_turns: whole turns beyond the recent window that must accumulate
            before a compaction is due (1; at least 1).
        notes_max: most model notes kept (8; fewer than the person's pinned decisions; at least 1).
        note_max_chars: longest model note, in characters (200; at least 10).
        archive_max_turns: most folded turns a thread's archive keeps, oldest out (2000; at least 1).
        archive_max_bytes: most bytes a thread's archive keeps (2,000,000; at least 1000), oldest out;
            the newest folded turn always stays.
        recall_share: share of the prompt budget recalled excerpts may use (0.15; 0 to 0.5; 0: no recall).
    """

    recent_turns: Annotated[int, Ge(1)] = 4
    summary_max_chars: Annotated[int, Ge(100)] = 2500
    pinned_max: Annotated[int, Ge(1)] = 20
    pinned_max_chars: Annotated[int, Ge(10)] = 300
    delivery_final_max_chars: Annotated[int, Ge(200)] = 8000
    compact_batch_turns: Annotated[int, Ge(1)] = 1
    notes_max: Annotated[int, Ge(1)] = 8
    note_max_chars: Annotated[int, Ge(10)] = 200
    archive_max_turns: Annotated[int, Ge(1)] = 2000
    archive_max_bytes: Annotated[int, Ge(1000)] = 2_000_000
    recall_share: Annotated[float, Ge(0), Le(0.5)] = 0.15
