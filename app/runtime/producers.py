"""Which producer answers a message.

``choose_producer(services, thread_id, text)`` (called by ``/ws/chat`` for each message):

| message | producer |
| --- | --- |
| ``/tasklist <goal>`` | ``TaskListProducer(goal)``: a new run (replacing one that waits) |
| ``/tasklist continue`` (also ``confirm``, ``yes``, ``go``, ``resume``) | resume the waiting run |
| a bare confirmation ("yes", "continue", "ok", ...) while a run waits | resume the waiting run |
| ``/tasklist cancel`` (also ``stop``, ``no``, ``drop``) | ``DropTaskListProducer`` |
| ``/delivery <goal>`` | ``DeliveryProducer(goal)`` |
| anything else | ``ToolChatProducer`` when tools are on (``TOOLS_ENABLED`` and the provider accepts them), else ``ChatProducer`` |

A command that cannot start raises ``CommandError`` (``empty_input``: no goal;
``nothing_to_resume``: no run waits), sent to the person as an error frame.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from app.runtime.capabilities import tools_enabled
from app.runtime.chat import ChatProducer
from app.runtime.delivery import DeliveryProducer
from app.runtime.run_store import RunStore
from app.runtime.tasklist import DropTaskListProducer, TaskListProducer
from app.runtime.tool_chat import ToolChatProducer

if TYPE_CHECKING:  # the layer above, for types only (docs/architecture.md)
    from app.extensions import Services
    from app.runtime.producer import Producer

_COMMAND = re.compile(r"^/(tasklist|delivery)(?:\s+(.*))?$", re.S | re.I)
RESUME_ARGS = frozenset({"continue", "confirm", "yes", "go", "resume"})
DROP_ARGS = frozenset({"cancel", "stop", "no", "drop"})
CONFIRM_WORDS = frozenset({"yes", "y", "yes please", "continue", "confirm", "confirmed", "go", "go ahead",
                           "go on", "ok", "okay", "proceed", "sure", "do it"})


class CommandError(ValueError):
    """A command that cannot start: ``code`` and ``message`` (for people) of an error frame."""

    def __init__(self, code: str, message: str):
        super().__init__(code)
        self.code = code
        self.message = message


def _word(text: str) -> str:
    return " ".join(text.lower().strip().rstrip(".!").split())


def is_confirmation(text: str) -> bool:
    """True when ``text`` is a bare confirmation such as "yes", "Continue." or "go ahead!"."""
    return _word(text) in CONFIRM_WORDS


def choose_producer(services: Services, thread_id: str, text: str) -> Producer:
    """The producer for the person's message ``text`` (see the module docstring).

    Raises:
        CommandError: ``/tasklist`` or ``/delivery`` without a goal, or nothing to resume.
    """
    match = _COMMAND.match(text.strip())
    if match:
        command, arg = match.group(1).lower(), (match.group(2) or "").strip()
        if not arg:
            raise CommandError("empty_input", f"Give it a goal: /{command} <goal>")
        if command == "delivery":
            return DeliveryProducer(arg)
        if _word(arg) in RESUME_ARGS:
            if RunStore(services.redis, thread_id).paused_id() is None:
                raise CommandError("nothing_to_resume", "There is no paused task list to continue.")
            return TaskListProducer(None)
        if _word(arg) in DROP_ARGS:
            return DropTaskListProducer()
        return TaskListProducer(arg)
    if is_confirmation(text) and RunStore(services.redis, thread_id).paused_id() is not None:
        return TaskListProducer(None)
    return ToolChatProducer() if tools_enabled(services) else ChatProducer()
