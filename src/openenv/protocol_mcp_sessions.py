"""OpenEnv's own ``/mcp`` session methods: the wire of OpenEnv 0.10's ``MCPToolClient``.

That client (Hugging Face OpenEnv's ``openenv.core.mcp_client``) has one
mode: plain JSON-RPC 2.0 ``POST``s to ``/mcp``, with no MCP ``initialize``
and no ``Mcp-Session-Id`` header, read only after ``raise_for_status()`` (so
every answer here, errors included, is HTTP 200):

- ``openenv/session/create`` (``params: {}``): ``{"session_id": ...}``
  (``Created``), an environment of its own under the server's cap;
- ``tools/list`` (``params: {"session_id"}``): ``{"tools": [{"name",
  "description", "inputSchema"}]}`` (``tool_list``);
- ``tools/call`` (``params: {"name", "arguments", "session_id"}``): the tool's
  result (``tool_call_result``), whose ``data`` the client returns;
- ``openenv/session/close`` (``params: {"session_id"}``): ``Closed``, with
  ``closing: true`` while a WebSocket is attached (the session ends when it
  leaves);
- and ``/ws?session_id=<id>`` (``SESSION_QUERY``), a v1 WebSocket attached
  to that session: its ``reset``/``step``/``state`` run on the environment the
  tools use.

A request is one of these when it names such a method or carries
``params.session_id`` (``openenv_request``); the MCP SDK's own streamable HTTP
(``initialize``, then ``Mcp-Session-Id``) is untouched.

>>> request = openenv_request(
...     b'{"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 1}'
... )
>>> request.method, request.id
('openenv/session/create', 1)
>>> openenv_request(b'{"jsonrpc": "2.0", "method": "initialize", "id": 1}') is None
True
>>> reply_text(result(1, Created(session_id="ab").model_dump()))
'{"jsonrpc":"2.0","id":1,"result":{"session_id":"ab"}}'
>>> reply_text(error(None, INVALID_PARAMS, "bad", {"code": "VALIDATION_ERROR"}))
'{"jsonrpc":"2.0","id":null,"error":{"code":-32602,"message":"bad","data":{"code":"VALIDATION_ERROR"}}}'
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openenv.protocol_errors import RequestId, summarise
from openenv.protocol_json import frame_text, reward_value
from openenv.tools import ImageContent, JsonContent, TextContent, ToolInfo, ToolOutput

__all__ = [
    "CLOSE",
    "CREATE",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "SERVER_ERROR",
    "SESSION_METHODS",
    "SESSION_QUERY",
    "TOOLS_CALL",
    "TOOLS_LIST",
    "BadRequest",
    "CallParams",
    "Closed",
    "Created",
    "RpcRequest",
    "SessionParams",
    "error",
    "openenv_request",
    "reply_text",
    "result",
    "tool_call_result",
    "tool_list",
]

SESSION_QUERY = "session_id"  # /ws?session_id=<id>: attach to that session
SESSION_METHODS = "openenv/session/"
CREATE = "openenv/session/create"
CLOSE = "openenv/session/close"
TOOLS_LIST = "tools/list"
TOOLS_CALL = "tools/call"

# JSON-RPC 2.0's error codes, and the one OpenEnv's server uses for a full server.
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000

_SID_MAX = 256  # longer than any id a server issues: refused, not looked up


class RpcRequest(BaseModel):
    """One JSON-RPC request, as OpenEnv's client sends it."""

    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any] = Field(default_factory=dict)
    id: RequestId | None = None


class SessionParams(BaseModel):
    """``params`` that name a session (``tools/list``, ``openenv/session/close``)."""

    session_id: str = Field(min_length=1, max_length=_SID_MAX)


class CallParams(SessionParams):
    """``tools/call``'s ``params``."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Created(BaseModel):
    """``openenv/session/create``'s result."""

    session_id: str


class Closed(BaseModel):
    """``openenv/session/close``'s result: ``closing`` while a WebSocket is attached."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    closed: bool
    closing: bool = False


class BadRequest(BaseModel):
    """One of OpenEnv's session requests that is no JSON-RPC 2.0 request: answered
    ``INVALID_REQUEST`` (with its ``id``, if it has a usable one)."""

    id: RequestId | None = None
    message: str


def openenv_request(body: bytes) -> RpcRequest | BadRequest | None:
    """``body`` as one of OpenEnv's session requests, or ``None`` if it is not one.

    A body that names an ``openenv/session/`` method or carries
    ``params.session_id`` is one; such a body that is malformed besides (no
    ``"jsonrpc": "2.0"``, ``params`` not an object) is a ``BadRequest``.

    >>> openenv_request(b'{"method": "openenv/session/create", "params": {}}').message
    'not a JSON-RPC 2.0 request: jsonrpc: Field required'
    """
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(message) is not dict:
        return None
    method, params = message.get("method"), message.get("params")
    if type(method) is not str:
        return None
    if not method.startswith(SESSION_METHODS) and not (
        type(params) is dict and SESSION_QUERY in params
    ):
        return None
    try:
        return RpcRequest.model_validate(message)
    except ValidationError as exc:
        request_id = message.get("id")
        return BadRequest(
            id=request_id if type(request_id) in (str, int) else None,
            message=f"not a JSON-RPC 2.0 request: {summarise(exc)}",
        )


def result(request_id: RequestId | None, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(
    request_id: RequestId | None, code: int, message: str, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON-RPC error; ``data`` as OpenEnv's server gives it (``active_sessions``, ...)."""
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": body}


def reply_text(reply: dict[str, Any]) -> str:
    """A reply as JSON text, floats as frames write them (NaN as ``"NaN"``)."""
    return frame_text(reply)


def tool_list(tools: list[ToolInfo]) -> dict[str, Any]:
    """``tools/list``'s result.

    >>> tool_list([ToolInfo(name="add", description="Add.")])
    {'tools': [{'name': 'add', 'description': 'Add.', 'inputSchema': {'type': 'object'}}]}
    """
    return {
        "tools": [
            {"name": t.name, "description": t.description, "inputSchema": t.input_schema}
            for t in tools
        ]
    }


def tool_call_result(output: ToolOutput) -> dict[str, Any]:
    """``tools/call``'s result: an MCP ``CallToolResult`` (``content``,
    ``structuredContent`` with the reward and the end of the episode,
    ``isError``), and ``data``, what OpenEnv's client returns: the tool's JSON
    value, else its text, as fastmcp's result carries it.

    >>> out = tool_call_result(ToolOutput.wrap({"value": 2}))
    >>> out["data"], out["content"]
    ({'value': 2}, [{'type': 'text', 'text': '{"value":2}'}])
    >>> done = tool_call_result(ToolOutput(content=[TextContent(text="ok")], reward=1.0))
    >>> done["data"], done["structuredContent"]
    ('ok', {'reward': 1.0, 'finished': False})
    """
    content: list[dict[str, Any]] = []
    for block in output.content:
        if isinstance(block, TextContent):
            content.append({"type": "text", "text": block.text})
        elif isinstance(block, JsonContent):
            content.append({"type": "text", "text": frame_text(block.data)})
        elif isinstance(block, ImageContent):
            content.append({"type": "image", "data": block.data, "mimeType": block.mime_type})
    structured: dict[str, Any] = {
        "reward": reward_value(output.reward),
        "finished": output.finished,
    }
    if output.metadata:
        structured["metadata"] = output.metadata
    data = output.data
    if data is not None:
        structured["data"] = data
    elif any(isinstance(block, TextContent) for block in output.content):
        data = output.text
    value = {"content": content, "structuredContent": structured, "isError": False, "data": data}
    # As JSON text and back: NaN and ±inf as text, as in every frame.
    parsed: dict[str, Any] = orjson.loads(frame_text(value))
    return parsed
