"""What the server answers when it cannot act on a frame: its error and close codes.

Part of the wire protocol, re-exported by ``openenv.protocol`` (the one place
to read it): ``ErrorCode`` names the ``code`` of an ``error`` frame,
``FATAL_CODES`` those after which the server closes the session, ``CloseCode``
the WebSocket close codes, and ``FrameError`` what server code raises to
answer a frame with an error.

>>> from pydantic import BaseModel
>>> class Move(BaseModel):
...     x: int
>>> try:
...     Move.model_validate({})
... except ValidationError as exc:
...     error = validation_frame_error(exc, "action", request_id=7)
>>> error.code.value, error.message, error.request_id
('VALIDATION_ERROR', 'invalid action: x: Field required', 7)
>>> error.details
{'errors': [{'loc': ['x'], 'msg': 'Field required', 'type': 'missing'}]}
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Annotated, Any

from pydantic import Strict, ValidationError

from openenv.errors import ServerSideError

__all__ = [
    "FATAL_CODES",
    "CloseCode",
    "ErrorCode",
    "FrameError",
    "RequestId",
    "summarise",
    "validation_frame_error",
    "wire_errors",
]

# Strict: a ``true`` id is refused, not answered as ``1`` (pydantic's lax int),
# as the paths that check an id by hand (``type(id) is int``) refuse it too.
RequestId = Annotated[int, Strict()] | str


class ErrorCode(StrEnum):
    """Why the server answered with an ``error`` frame."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"
    TIMEOUT = "TIMEOUT"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    EPISODE_FINISHED = "EPISODE_FINISHED"


# After one of these the server closes the socket; after any other code the
# session goes on and the next message is served as usual. A TIMEOUT is fatal
# only when its frame says ``"fatal": true`` (a blocking call that overran).
FATAL_CODES = frozenset(
    {ErrorCode.CAPACITY_REACHED, ErrorCode.FACTORY_ERROR, ErrorCode.SESSION_ERROR}
)


class CloseCode(IntEnum):
    """WebSocket close codes the server uses, and when."""

    NORMAL = 1000
    GOING_AWAY = 1001  # server shutting down, or the session idled out
    POLICY_VIOLATION = 1008  # too many bad frames (a bad key or Origin: HTTP 401/403)
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013  # at capacity


class FrameError(ServerSideError):
    """A client frame the server cannot act on; becomes an ``error`` frame."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        request_id: RequestId | None = None,
        details: dict[str, Any] | None = None,
        bad_frame: bool = True,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details = details or {}
        # Whether it counts toward max_bad_frames (the sender's fault, not a model's).
        self.bad_frame = bad_frame


def wire_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors, reduced to what is JSON-safe and useful on the wire."""
    return [
        {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def summarise(exc: ValidationError) -> str:
    """Pydantic's errors as one line: ``where: what`` for each, joined by ``;``."""
    parts = []
    for e in exc.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "(root)"
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)


def validation_frame_error(
    exc: ValidationError, what: str, request_id: RequestId | None
) -> FrameError:
    """Turn a pydantic error on an action or reset arguments into a ``FrameError``."""
    return FrameError(
        ErrorCode.VALIDATION_ERROR,
        f"invalid {what}: {summarise(exc)}",
        request_id=request_id,
        details={"errors": wire_errors(exc)},
    )
