"""Whether chat turns offer tools: ``TOOLS_ENABLED`` and the provider has not refused them.

A provider that answers a request with ``tools`` by refusing them (HTTP 400, 422, 500 or 501
naming a tool or function) gets plain chat, and the refusal is recorded in its
``ProviderCaps`` record (``Services.provider_caps``, shared by every process, a day's TTL), so
later turns of every process, and the page, know tools are off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.llm.provider import is_refusal

if TYPE_CHECKING:  # the layer above, for types only (docs/architecture.md)
    from app.extensions import Services

TOOLS = "tools"
_TOOL_WORDS = ("tool", "function")


def tools_enabled(services: Services) -> bool:
    """True when ``TOOLS_ENABLED`` is set and the provider of ``services`` has not refused tools."""
    return bool(services.settings.tools_enabled) and not services.provider_caps.refuses(TOOLS)


def rejects_tools(error: BaseException) -> bool:
    """True when a mapped ``LLMError`` (see ``app.llm.client.mapped_error``) is the provider refusing tools."""
    return is_refusal(error, _TOOL_WORDS)


def mark_tools_refused(services: Services) -> None:
    """Record that the provider of ``services`` refuses tools (best effort)."""
    services.provider_caps.mark_refused(TOOLS)
