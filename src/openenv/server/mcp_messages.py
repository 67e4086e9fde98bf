"""What the MCP bridge (``server/mcp_bridge.py``) reads of requests and writes as answers."""

from __future__ import annotations

import mcp_types as mcp
import orjson
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Scope

from openenv.protocol_mcp_sessions import tool_call_result
from openenv.tools import ToolOutput

__all__ = [
    "client_address",
    "is_initialize",
    "opens_session",
    "rpc_error",
    "to_mcp",
]

_PROTOCOL_VERSION_HEADER = "mcp-protocol-version"


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


def opens_session(headers: Headers) -> bool:
    """Whether a POST without a session id is a handshake-era request (it may open one)."""
    version = headers.get(_PROTOCOL_VERSION_HEADER)
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS


def to_mcp(output: ToolOutput) -> mcp.CallToolResult:
    """A tool's output as MCP's result: reward and the end of the episode ride in
    ``structuredContent``, where any MCP client can read them without parsing text
    (the shape OpenEnv's ``tools/call`` answers too, less its ``data``)."""
    result = tool_call_result(output)
    del result["data"]
    return mcp.CallToolResult.model_validate(result)


def rpc_error(status: int, code: int, message: str) -> JSONResponse:
    """A JSON-RPC error with no request id, as the MCP SDK answers transport-level refusals.

    A 503 (full, shutting down) says when to retry, as ``/ws`` and ``/reset`` do."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(body, status_code=status, headers=headers)
