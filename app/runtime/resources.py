"""Local documents served as MCP-style resources (``resource://docs/<name>``).

The documents are the Markdown files of ``docs/resources/``.  Like an MCP server's
``resources/list`` and ``resources/read``, ``list_resources()`` describes them (uri, name,
title, mimeType) and ``read_resource(uri)`` returns one's text.  A resource's contents are
runtime data: they go into the in-turn prompt as a tool result and are never written to
memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.settings import ROOT

RESOURCE_DIR = ROOT / "docs" / "resources"
URI_PREFIX = "resource://docs/"
MAX_RESOURCE_CHARS = 8000  # a resource longer than this is cut (characters)


class ResourceError(LookupError):
    """An unknown or malformed resource URI; the message is safe to show to the model."""


@dataclass(frozen=True)
class Resource:
    """One served document: ``uri`` (``resource://docs/<name>``), ``name``, ``title`` (its first heading)."""

    uri: str
    name: str
    title: str
    path: Path
    mime_type: str = "text/markdown"

    def describe(self) -> dict:
        """The MCP ``resources/list`` entry."""
        return {"uri": self.uri, "name": self.name, "title": self.title, "mimeType": self.mime_type}


def _title(path: Path) -> str:
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    except OSError:
        pass
    return path.stem


def list_resources(directory: Path = RESOURCE_DIR) -> list[Resource]:
    """The served documents, sorted by name (an absent directory serves nothing)."""
    if not directory.is_dir():
        return []
    return [Resource(URI_PREFIX + p.stem, p.stem, _title(p), p)
            for p in sorted(directory.glob("*.md")) if p.is_file()]


def read_resource(uri: object, directory: Path = RESOURCE_DIR) -> str:
    """The text of the resource at ``uri`` (at most ``MAX_RESOURCE_CHARS`` characters).

    Only names listed by ``list_resources`` resolve, so no path outside the directory can
    be read.

    Raises:
        ResourceError: ``uri`` is not a string naming a served document.
    """
    if not isinstance(uri, str) or not uri.startswith(URI_PREFIX):
        raise ResourceError(f"unknown resource; URIs look like {URI_PREFIX}<name>")
    name = uri[len(URI_PREFIX):].strip()
    if name.endswith(".md"):
        name = name[:-3]
    by_name = {r.name: r for r in list_resources(directory)}
    resource = by_name.get(name)
    if resource is None:
        known = ", ".join(r.uri for r in by_name.values()) or "none"
        raise ResourceError(f"unknown resource {uri!r}; available: {known}")
    text = resource.path.read_text(encoding="utf-8")
    if len(text) > MAX_RESOURCE_CHARS:
        text = text[:MAX_RESOURCE_CHARS] + "\n[truncated]"
    return text
