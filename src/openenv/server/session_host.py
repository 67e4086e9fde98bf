"""What a session stands on: its states, its log, and the server that holds it.

The protocols here are what ``Session`` needs of its server (``EnvService``
is one; the in-process runtime's host is another), and the helpers read what
an environment's methods accept. Apart from ``sessions.py`` so that the
session core stays about messages.
"""

from __future__ import annotations

import asyncio
import difflib
import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from openenv import protocol
from openenv.environment import Environment
from openenv.errors import ServerSideError
from openenv.protocol import ErrorCode
from openenv.server.handoff import LaneTicket, Receiver

if TYPE_CHECKING:
    from openenv.server.config import ServerSettings
    from openenv.server.metrics import Metrics
    from openenv.server.slots import SessionRegistry
    from openenv.types import Action

__all__ = [
    "EnvFailure",
    "Lane",
    "SessionHost",
    "SessionLog",
    "SessionState",
    "read_state",
    "unknown_tool_message",
]


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# Read on every request: on CPython 3.11 an Enum member costs a lookup through
# EnumType four times dearer than a module global (about 900 instructions).
OPEN = SessionState.OPEN


class SessionLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Puts the session id on every line, as text and as ``record.session_id``."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs.setdefault("extra", {}).update(self.extra or {})
        return f"[session {self.extra['session_id'] if self.extra else '?'}] {msg}", kwargs


class Lane(Protocol):
    """Where a session's plain ``def`` calls run (``server/handoff.py``'s ``Handoff``)."""

    def submit(
        self,
        ticket: LaneTicket,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        timed: bool = False,
    ) -> asyncio.Future[Any]: ...

    def drop_queued(self, ticket: LaneTicket) -> None: ...

    def dispatch(
        self,
        ticket: LaneTicket,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        receiver: Receiver,
    ) -> None: ...


class SessionHost(Protocol):
    """What a session needs from the server that holds it (an ``EnvService``)."""

    @property
    def action_cls(self) -> type[Action]: ...
    @property
    def registry(self) -> SessionRegistry: ...
    @property
    def settings(self) -> ServerSettings: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def handoff(self) -> Lane: ...


class EnvFailure(ServerSideError):
    """The environment failed a call; becomes an error frame (``code``)."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        request_id: protocol.RequestId | None,
        *,
        fatal: bool = False,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.fatal = fatal
        self.details: dict[str, Any] = {"fatal": True} if fatal else {}


def unknown_tool_message(name: str, known: list[str]) -> str:
    if not known:
        return f"unknown tool {name!r}: this environment has no tools"
    hint = difflib.get_close_matches(name, known, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    return f"unknown tool {name!r}; the tools are: {', '.join(known)}{suggestion}"


def read_state(env: Environment[Any, Any, Any]) -> Any:
    return env.state
