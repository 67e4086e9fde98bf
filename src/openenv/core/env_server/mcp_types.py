"""``openenv.core.env_server.mcp_types``: OpenEnv 0.10's MCP actions, observations and
JSON-RPC models (``CallToolAction``, ``ListToolsAction``, ``CallToolObservation``,
``ListToolsObservation``, ``Tool``, ``ToolError``, ...), with OpenEnv's fields.

>>> from openenv.core.env_server.mcp_types import ListToolsAction, ListToolsObservation
>>> ListToolsObservation(tools=[]).tools, ListToolsAction().type
([], 'list_tools')
"""

from __future__ import annotations

from openenv.core._mcp_types import (
    RESERVED_TOOL_NAMES,
    CallToolAction,
    CallToolObservation,
    JsonRpcError,
    JsonRpcErrorCode,
    JsonRpcRequest,
    JsonRpcResponse,
    ListToolsAction,
    ListToolsObservation,
    McpMethod,
    Tool,
    ToolError,
    ToolErrorType,
    WSMCPMessage,
    WSMCPResponse,
)

__all__ = [
    "RESERVED_TOOL_NAMES",
    "CallToolAction",
    "CallToolObservation",
    "JsonRpcError",
    "JsonRpcErrorCode",
    "JsonRpcRequest",
    "JsonRpcResponse",
    "ListToolsAction",
    "ListToolsObservation",
    "McpMethod",
    "Tool",
    "ToolError",
    "ToolErrorType",
    "WSMCPMessage",
    "WSMCPResponse",
]
