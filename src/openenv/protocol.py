"""The wire protocol (v1): the only module that knows the JSON shape of a frame.

Every frame is a UTF-8 JSON text frame ``{"type": ..., "data": ..., "id"?: ...}``.
The shape is compatible with OpenEnv's ``/ws`` protocol, so a client written
for OpenEnv works against an openenv server unchanged.

Client to server: ``reset``, ``step``, ``state``, ``close``, and for
environments with tools ``list_tools``, ``call_tool``, ``get_prompt``.
Server to client: ``observation``, ``state``, ``error``, ``tools``,
``tool_result``, ``prompt``.

A request may carry an ``id`` (string or integer); the reply carries the same
``id`` so that a client can match replies to requests.

A client that offers the WebSocket subprotocol ``openenv.v2`` gets protocol v2
instead: many sessions per connection, each of these messages tagged with its
``session``, many of them per frame (``openenv/protocol_v2.py`` defines it).

The error and close codes (``openenv/protocol_errors.py``) and the HTTP
routes' bodies (``openenv/protocol_http.py``) are re-exported from here;
OpenEnv's own ``/mcp`` session methods and ``/ws?session_id=`` are in
``openenv/protocol_mcp_sessions.py``.

>>> msg = parse_client_message('{"type": "step", "data": {"message": "hi"}, "id": 7}')
>>> type(msg).__name__, msg.data, msg.id
('StepRequest', {'message': 'hi'}, 7)
>>> error_frame(ErrorCode.UNKNOWN_TYPE, "unknown message type 'jump'", request_id=7)
'{"type":"error","data":{"message":"unknown message type \\'jump\\'","code":"UNKNOWN_TYPE"},"id":7}'
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from openenv.protocol_errors import (
    FATAL_CODES,
    CloseCode,
    ErrorCode,
    FrameError,
    RequestId,
    summarise,
    validation_frame_error,
    wire_errors,
)
from openenv.protocol_http import (
    EnvInfo,
    EnvListing,
    Health,
    MultiHealth,
    ReplicaHealth,
    ReplicaList,
    SplitList,
    TaskPage,
)
from openenv.protocol_json import (
    _plain,
    frame_text,
    observation_frame,
    observation_reply,
    observation_serializer,
    reward_from,
    reward_value,
)
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import Observation, State

__all__ = [
    "FATAL_CODES",
    "PROTOCOL_VERSION",
    "CallToolRequest",
    "ClientMessage",
    "CloseCode",
    "CloseRequest",
    "EnvInfo",
    "EnvListing",
    "ErrorCode",
    "ErrorReply",
    "FrameError",
    "GetPromptRequest",
    "Health",
    "ListToolsRequest",
    "MultiHealth",
    "ObservationReply",
    "PromptReply",
    "ReplicaHealth",
    "ReplicaList",
    "RequestId",
    "ResetRequest",
    "ServerMessage",
    "SplitList",
    "StateReply",
    "StateRequest",
    "StepRequest",
    "TaskPage",
    "ToolList",
    "ToolResultReply",
    "ToolsReply",
    "decode_frame",
    "error_frame",
    "json_text",
    "observation_frame",
    "observation_from_payload",
    "observation_reply",
    "observation_serializer",
    "parse_client_message",
    "parse_server_message",
    "plain_step",
    "prompt_frame",
    "request_frame",
    "reward_from",
    "reward_value",
    "state_frame",
    "tool_result_frame",
    "tools_frame",
    "validate_client_message",
    "validation_frame_error",
]

PROTOCOL_VERSION = 1


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


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ListToolsRequest(_Message):
    """Ask for the environment's tools."""

    type: Literal["list_tools"] = "list_tools"


class CallToolRequest(_Message):
    """Call one tool: ``data`` is ``{"name": ..., "arguments": {...}}``."""

    type: Literal["call_tool"] = "call_tool"
    data: ToolCall


class PromptQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: dict[str, Any] | None = None


class GetPromptRequest(_Message):
    """Ask for the prompt of a task: ``data.task``, or else the task of the last reset."""

    type: Literal["get_prompt"] = "get_prompt"
    data: PromptQuery = Field(default_factory=PromptQuery)


ClientMessage = Annotated[
    ResetRequest
    | StepRequest
    | StateRequest
    | CloseRequest
    | ListToolsRequest
    | CallToolRequest
    | GetPromptRequest,
    Field(discriminator="type"),
]
_CLIENT_MODELS: tuple[type[_Message], ...] = (
    ResetRequest,
    StepRequest,
    StateRequest,
    CloseRequest,
    ListToolsRequest,
    CallToolRequest,
    GetPromptRequest,
)
_CLIENT_VALIDATORS = {
    cls.model_fields["type"].default: cls.__pydantic_validator__ for cls in _CLIENT_MODELS
}
_CLIENT_TYPES = tuple(_CLIENT_VALIDATORS)


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


class ToolList(BaseModel):
    """The ``tools`` reply's data, and ``GET /tools``."""

    tools: list[ToolInfo]


class ToolsReply(_Message):
    """The environment's tools."""

    type: Literal["tools"] = "tools"
    data: ToolList


class ToolResultReply(_Message):
    """What a tool call produced: content blocks, ``reward``, ``finished``, ``metadata``."""

    type: Literal["tool_result"] = "tool_result"
    data: ToolOutput


class PromptPayload(BaseModel):
    prompt: str


class PromptReply(_Message):
    """The prompt of a task."""

    type: Literal["prompt"] = "prompt"
    data: PromptPayload


ServerMessage = Annotated[
    ObservationReply | StateReply | ErrorReply | ToolsReply | ToolResultReply | PromptReply,
    Field(discriminator="type"),
]
_server_adapter: TypeAdapter[ServerMessage] = TypeAdapter(ServerMessage)


# -- decoding -----------------------------------------------------------------


def parse_client_message(frame: str | bytes) -> ClientMessage:
    """Decode one client frame, or raise ``FrameError`` naming what is wrong."""
    return validate_client_message(decode_frame(frame))


def decode_frame(frame: str | bytes) -> dict[str, Any]:
    """The JSON object in a client frame; ``FrameError`` if it is not one."""
    try:
        obj = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise FrameError(ErrorCode.INVALID_JSON, f"frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(
            ErrorCode.INVALID_JSON,
            f"frame must be a JSON object, got {type(obj).__name__}",
        )
    return obj


def plain_step(
    obj: dict[str, Any], keys: int = 2
) -> tuple[dict[str, Any], RequestId | None] | None:
    """``(data, id)`` of a decoded frame that is a well-formed ``step``, else ``None``.

    Steps are nearly every frame a server sees. This accepts only frames that
    ``StepRequest`` would take unchanged (a ``data`` object; an ``id`` that is
    an int, a string or absent; no other keys), at a fraction of a
    validation's cost; anything else goes to ``validate_client_message``,
    which decides it and names what is wrong. ``keys``: how many keys it has
    besides ``id``, 3 for a v2 request whose ``session`` (checked by the
    caller) is still in it.

    >>> plain_step({"type": "step", "data": {"message": "hi"}, "id": 7})
    ({'message': 'hi'}, 7)
    >>> plain_step({"type": "step", "data": [], "id": 7}) is None
    True
    >>> plain_step({"type": "step", "data": {}, "extra": 1}) is None
    True
    >>> plain_step({"session": 0, "type": "step", "data": {}, "id": 7}, 3)
    ({}, 7)
    >>> plain_step({"data": {}}), plain_step({"type": "step"}), plain_step({"type": "reset"})
    (None, None, None)
    >>> plain_step({"type": "step", "data": {}, "id": None})
    ({}, None)
    >>> plain_step({"type": "step", "data": {}})
    ({}, None)
    >>> plain_step({"type": "step", "data": {}, "id": True}) is None
    True
    """
    # Subscripts, not .get(): a method call each is dearer, and a step without
    # "type" or "data" is rare (-0.8% instructions a v2 echo step, measured).
    try:
        if obj["type"] != "step":
            return None
        data = obj["data"]
    except KeyError:
        return None
    if type(data) is not dict:
        return None
    # No key but "type", "data" and "id" (the first two are there by now),
    # counted: a third of the cost of comparing the keys with a set.
    size = len(obj)
    if size == keys:
        return data, None
    request_id = obj.get("id")
    if (
        size == keys + 1
        and (request_id is None or type(request_id) is int or type(request_id) is str)
        and "id" in obj
    ):
        return data, request_id
    return None


def validate_client_message(obj: dict[str, Any]) -> ClientMessage:
    """Check a decoded client frame against its message type; ``FrameError`` if wrong."""
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
            f"invalid {kind!r} message: {summarise(exc)}",
            request_id=request_id,
            details={"errors": wire_errors(exc)},
        ) from None


def parse_server_message(frame: str | bytes | dict[str, Any]) -> ServerMessage:
    """Decode one server frame, or one reply of a v2 frame already decoded (client
    side); raises ``ValueError`` if malformed."""
    try:
        if isinstance(frame, dict):
            return _server_adapter.validate_python(frame)
        return _server_adapter.validate_json(frame)
    except ValidationError as exc:
        raise ValueError(f"malformed frame from server: {summarise(exc)}") from None


def _unknown_type_message(kind: object) -> str:
    if not isinstance(kind, str):
        return f"frame needs a string 'type', one of {', '.join(_CLIENT_TYPES)}"
    hint = difflib.get_close_matches(kind, _CLIENT_TYPES, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    return f"unknown message type {kind!r}, expected one of {', '.join(_CLIENT_TYPES)}{suggestion}"


# -- encoding -----------------------------------------------------------------


def _frame(kind: str, data: Any, request_id: RequestId | None) -> str:
    frame: dict[str, Any] = {"type": kind, "data": data}
    if request_id is not None:
        frame["id"] = request_id
    return frame_text(frame)


def json_text(value: Any) -> str:
    """A JSON value as text, the way frames encode it.

    >>> json_text({"value": 3})
    '{"value":3}'
    """
    return frame_text(value)


def state_frame(
    state: State, request_id: RequestId | None = None, *, finished: bool | None = None
) -> str:
    """Encode a state reply; ``finished`` (tool environments) is reported as ``done``."""
    data = state.model_dump(mode="json", fallback=_plain)  # NumPy values as their tolist()
    if finished is not None:
        data["done"] = data.get("done") is True or finished
    return _frame("state", data, request_id)


def tools_frame(tools: list[ToolInfo], request_id: RequestId | None = None) -> str:
    """Encode a ``tools`` reply."""
    return _frame("tools", ToolList(tools=tools).model_dump(mode="json"), request_id)


def tool_result_frame(output: ToolOutput, request_id: RequestId | None = None) -> str:
    """Encode a ``tool_result`` reply."""
    data = output.model_dump(mode="json")
    data["reward"] = reward_value(data["reward"])
    return _frame("tool_result", data, request_id)


def prompt_frame(prompt: str, request_id: RequestId | None = None) -> str:
    """Encode a ``prompt`` reply."""
    return _frame("prompt", {"prompt": prompt}, request_id)


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
    kind: Literal["reset", "step", "state", "close", "list_tools", "call_tool", "get_prompt"],
    data: dict[str, Any] | None = None,
    request_id: RequestId | None = None,
) -> str:
    """Encode a client request (``data`` is left out when ``None``)."""
    frame: dict[str, Any] = {"type": kind}
    if data is not None:
        frame["data"] = data
    if request_id is not None:
        frame["id"] = request_id
    return frame_text(frame)


ObsT = TypeVar("ObsT", bound=Observation)


def observation_from_payload(cls: type[ObsT], payload: ObservationPayload) -> ObsT:
    """Rebuild a typed observation from an ``observation`` reply."""
    # model_validate without its Python wrapper: one per reply a client reads.
    return cls.__pydantic_validator__.validate_python(  # type: ignore[no-any-return]
        {
            **payload.observation,
            "reward": payload.reward,
            "done": payload.done,
            "metadata": payload.metadata,
        }
    )
