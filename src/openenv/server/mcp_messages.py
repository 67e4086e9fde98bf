"""What the MCP bridge (``server/mcp_bridge.py``) reads of requests and writes as answers."""

from __future__ import annotations

from typing import Any

import mcp_types as mcp
import orjson
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Scope

from openenv import protocol
from openenv.tools import ImageContent, JsonContent, TextContent, ToolOutput

__all__ = [
    "client_address",
    "foreign_session_call",
    "is_initialize",
    "opens_session",
    "rpc_error",
    "to_mcp",
]

_PROTOCOL_VERSION_HEADER = "mcp-protocol-version"

# OpenEnv's own /mcp session methods (its MCPToolClient's production mode):
# JSON-RPC POSTs with no MCP handshake, ``params.session_id`` naming the session.
_FOREIGN_SESSION_METHODS = "openenv/session/"
_NOT_SERVED = (
    "{method} is OpenEnv's own /mcp session protocol (the production mode of "
    "OpenEnv's MCPToolClient), which this server does not serve: its /mcp is the "
    "standard MCP streamable HTTP transport (initialize, then Mcp-Session-Id). Use an "
    "MCP client (mcp.Client(url + '/mcp')), openenv.core.mcp_client.MCPToolClient, or "
    "OpenEnv's EnvClient stepping ListToolsAction/CallToolAction over /ws "
    "(docs/compat.md)"
)


def client_address(scope: Scope) -> str:
    """The remote address (behind a proxy, its own unless uvicorn trusts its headers)."""
    client = scope.get("client")
    return str(client[0]) if client else ""


def is_initialize(body: bytes) -> bool:
    """Whether a POST's body is a JSON-RPC ``initialize`` (anything else opens no
    session, and the SDK refuses it as it would)."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return type(message) is dict and message.get("method") == "initialize"


def foreign_session_call(body: bytes) -> JSONResponse | None:
    """The answer to one of OpenEnv's own ``openenv/session/*`` calls: a JSON-RPC
    "method not found" that says what to use instead, or ``None`` for any other body.

    With HTTP 200, as OpenEnv's client expects of a JSON-RPC error: it raises
    the message (on a 4xx it would show only the status).

    >>> foreign_session_call(b'{"jsonrpc": "2.0", "method": "tools/list", "id": 1}') is None
    True
    >>> answer = foreign_session_call(
    ...     b'{"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 1}'
    ... )
    >>> answer.status_code, orjson.loads(answer.body)["error"]["code"]
    (200, -32601)
    """
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(message) is not dict:
        return None
    method = message.get("method")
    if type(method) is not str or not method.startswith(_FOREIGN_SESSION_METHODS):
        return None
    request_id = message.get("id")
    error = {"code": mcp.METHOD_NOT_FOUND, "message": _NOT_SERVED.format(method=method)}
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error})


def opens_session(headers: Headers) -> bool:
    """Whether a POST without a session id is a handshake-era request (it may open one)."""
    version = headers.get(_PROTOCOL_VERSION_HEADER)
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS


def to_mcp(output: ToolOutput) -> mcp.CallToolResult:
    content: list[mcp.TextContent | mcp.ImageContent] = []
    for block in output.content:
        if isinstance(block, TextContent):
            content.append(mcp.TextContent(text=block.text))
        elif isinstance(block, JsonContent):
            content.append(mcp.TextContent(text=protocol.json_text(block.data)))
        elif isinstance(block, ImageContent):
            content.append(mcp.ImageContent(data=block.data, mime_type=block.mime_type))
    # Reward and the end of the episode ride in structuredContent, where any
    # MCP client can read them without parsing text.
    structured: dict[str, Any] = {
        "reward": protocol.reward_value(output.reward),
        "finished": output.finished,
    }
    if output.metadata:
        structured["metadata"] = output.metadata
    if (data := output.data) is not None:
        structured["data"] = data
    # As JSON text and back: NaN and ±inf as text, as in the content (the SDK
    # would write null).
    structured = orjson.loads(protocol.json_text(structured))
    return mcp.CallToolResult(content=content, structured_content=structured)


def rpc_error(status: int, code: int, message: str) -> JSONResponse:
    """A JSON-RPC error with no request id, as the MCP SDK answers transport-level refusals."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status)
