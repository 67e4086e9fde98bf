"""The wire protocol (v1): the only module that knows the JSON shape of a frame.

Every frame is a UTF-8 JSON text frame ``{"type": ..., "data": ..., "id"?: ...}``.
The shape is compatible with OpenEnv's ``/ws`` protocol, so a client written
for OpenEnv works against an openenv server unchanged.

Client to server: ``reset``, ``step``, ``state``, ``close``.
Server to client: ``observation``, ``state``, ``error``.

A request may carry an ``id`` (string or integer); the reply carries the same
``id`` so that a client can match replies to requests.

>>> msg = parse_client_message('{"type": "step", "data": {"message": "hi"}, "id": 7}')
>>> type(msg).__name__, msg.data, msg.id
('StepRequest', {'message': 'hi'}, 7)
>>> error_frame(ErrorCode.UNKNOWN_TYPE, "unknown message type 'jump'", request_id=7)
'{"type":"error","data":{"message":"unknown message type \\'jump\\'","code":"UNKNOWN_TYPE"},"id":7}'
"""

from __future__ import annotations

import difflib
from enum import IntEnum, StrEnum
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from openenv.types import Observation, State

__all__ = [
    "FATAL_CODES",
    "PROTOCOL_VERSION",
    "ClientMessage",
    "CloseCode",
    "CloseRequest",
    "ErrorCode",
    "ErrorReply",
    "FrameError",
    "ObservationReply",
    "RequestId",
    "ResetRequest",
    "ServerMessage",
    "StateReply",
    "StateRequest",
    "StepRequest",
    "error_frame",
    "observation_frame",
    "observation_from_payload",
    "parse_client_message",
    "parse_server_message",
    "request_frame",
    "state_frame",
    "validation_frame_error",
]

PROTOCOL_VERSION = 1

RequestId = int | str


class ErrorCode(StrEnum):
    """Why the server answered with an ``error`` frame."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


# After one of these the server closes the socket; after any other code the
# session goes on and the next message is served as usual.
FATAL_CODES = frozenset(
    {ErrorCode.CAPACITY_REACHED, ErrorCode.FACTORY_ERROR, ErrorCode.SESSION_ERROR}
)


class CloseCode(IntEnum):
    """WebSocket close codes the server uses, and when."""

    NORMAL = 1000
    GOING_AWAY = 1001  # server shutting down, or the session idled out
    UNAUTHORIZED = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013  # at capacity


class FrameError(Exception):
    """A client frame the server cannot act on; becomes an ``error`` frame."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        request_id: RequestId | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details = details or {}


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: RequestId | None = None


# -- client to server ---------------------------------------------------------


class ResetRequest(_Message):
    """Start a new episode; ``data`` holds ``seed``, ``episode_id`` and extra kwargs."""

    type: Literal["reset"] = "reset"
    data: dict[str, Any] = Field(default_factory=dict)


class StepRequest(_Message):
    """Apply one action; ``data`` holds the action's fields."""

    type: Literal["step"] = "step"
    data: dict[str, Any]


class StateRequest(_Message):
    """Ask for the environment's current state."""

    type: Literal["state"] = "state"


class CloseRequest(_Message):
    """End the session; the server closes the socket with code 1000."""

    type: Literal["close"] = "close"


ClientMessage = Annotated[
    ResetRequest | StepRequest | StateRequest | CloseRequest, Field(discriminator="type")
]
_CLIENT_TYPES = ("reset", "step", "state", "close")
_client_adapter: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)
_CLIENT_VALIDATORS = {
    cls.model_fields["type"].default: cls.__pydantic_validator__
    for cls in (ResetRequest, StepRequest, StateRequest, CloseRequest)
}


# -- server to client ---------------------------------------------------------


class ObservationPayload(BaseModel):
    observation: dict[str, Any]
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)


class ObservationReply(_Message):
    """The observation that ``reset`` or ``step`` produced."""

    type: Literal["observation"] = "observation"
    data: ObservationPayload


class StateReply(_Message):
    """The environment's state, as its ``State`` model dumps it."""

    type: Literal["state"] = "state"
    data: dict[str, Any]


class ErrorPayload(BaseModel):
    model_config = ConfigDict(extra="allow")

    message: str
    code: ErrorCode


class ErrorReply(_Message):
    """An error; ``data.code`` is an ``ErrorCode``, extra keys carry details."""

    type: Literal["error"] = "error"
    data: ErrorPayload


ServerMessage = Annotated[ObservationReply | StateReply | ErrorReply, Field(discriminator="type")]
_server_adapter: TypeAdapter[ServerMessage] = TypeAdapter(ServerMessage)


# -- decoding -----------------------------------------------------------------


def parse_client_message(frame: str | bytes) -> ClientMessage:
    """Decode one client frame, or raise ``FrameError`` naming what is wrong."""
    try:
        obj = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise FrameError(ErrorCode.INVALID_JSON, f"frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(
            ErrorCode.INVALID_JSON,
            f"frame must be a JSON object, got {type(obj).__name__}",
        )
    request_id = obj.get("id")
    if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
        request_id = None
    kind = obj.get("type")
    validator = _CLIENT_VALIDATORS.get(kind) if isinstance(kind, str) else None
    if validator is None:
        raise FrameError(
            ErrorCode.UNKNOWN_TYPE,
            _unknown_type_message(kind),
            request_id=request_id,
        )
    try:
        # The type is known by now, so validate against its model alone rather
        # than the discriminated union: the same result and errors, less work.
        message: ClientMessage = validator.validate_python(obj)
        return message
    except ValidationError as exc:
        raise FrameError(
            ErrorCode.VALIDATION_ERROR,
            f"invalid {kind!r} message: {_summarise(exc)}",
            request_id=request_id,
            details={"errors": _errors(exc)},
        ) from None


def parse_server_message(frame: str | bytes) -> ServerMessage:
    """Decode one server frame (client side); raises ``ValueError`` if malformed."""
    try:
        return _server_adapter.validate_json(frame)
    except ValidationError as exc:
        raise ValueError(f"malformed frame from server: {_summarise(exc)}") from None


def _unknown_type_message(kind: object) -> str:
    if not isinstance(kind, str):
        return f"frame needs a string 'type', one of {', '.join(_CLIENT_TYPES)}"
    hint = difflib.get_close_matches(kind, _CLIENT_TYPES, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    return f"unknown message type {kind!r}, expected one of {', '.join(_CLIENT_TYPES)}{suggestion}"


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors, reduced to what is JSON-safe and useful on the wire."""
    return [
        {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def _summarise(exc: ValidationError) -> str:
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
        f"invalid {what}: {_summarise(exc)}",
        request_id=request_id,
        details={"errors": _errors(exc)},
    )


# -- encoding -----------------------------------------------------------------


def _frame(kind: str, data: Any, request_id: RequestId | None) -> str:
    frame: dict[str, Any] = {"type": kind, "data": data}
    if request_id is not None:
        frame["id"] = request_id
    return orjson.dumps(frame, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def observation_frame(observation: Observation, request_id: RequestId | None = None) -> str:
    """Encode an observation reply; reward and done travel beside the fields."""
    # The model's prebuilt serializer, without an ``exclude`` set to resolve on
    # every call; the envelope fields are then moved out of the dump.
    fields = observation.__pydantic_serializer__.to_python(observation, mode="json")
    del fields["reward"], fields["done"], fields["metadata"]
    payload: dict[str, Any] = {
        "observation": fields,
        "reward": observation.reward,
        "done": observation.done,
    }
    if observation.metadata:
        payload["metadata"] = observation.metadata
    return _frame("observation", payload, request_id)


def state_frame(state: State, request_id: RequestId | None = None) -> str:
    """Encode a state reply."""
    return _frame("state", state.model_dump(mode="json"), request_id)


def error_frame(
    code: ErrorCode,
    message: str,
    *,
    request_id: RequestId | None = None,
    **details: Any,
) -> str:
    """Encode an error reply; ``details`` become extra keys beside message and code."""
    return _frame("error", {"message": message, "code": code.value, **details}, request_id)


def request_frame(
    kind: Literal["reset", "step", "state", "close"],
    data: dict[str, Any] | None = None,
    request_id: RequestId | None = None,
) -> str:
    """Encode a client request (``data`` is left out when ``None``)."""
    frame: dict[str, Any] = {"type": kind}
    if data is not None:
        frame["data"] = data
    if request_id is not None:
        frame["id"] = request_id
    return orjson.dumps(frame, option=orjson.OPT_SERIALIZE_NUMPY).decode()


ObsT = TypeVar("ObsT", bound=Observation)


def observation_from_payload(cls: type[ObsT], payload: ObservationPayload) -> ObsT:
    """Rebuild a typed observation from an ``observation`` reply."""
    return cls.model_validate(
        {
            **payload.observation,
            "reward": payload.reward,
            "done": payload.done,
            "metadata": payload.metadata,
        }
    )
