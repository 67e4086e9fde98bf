"""OpenEnv 0.10's MCP models, field for field (``openenv.core.env_server.mcp_types``).

OpenEnv's tool-calling environments (``MCPEnvironment``) are played through
``step``: ``ListToolsAction()`` answers a ``ListToolsObservation`` of ``Tool``\\s,
``CallToolAction(tool_name=..., arguments=...)`` a ``CallToolObservation``
(the tool's result, or a ``ToolError``). Nothing here needs ``fastmcp``; they
live outside ``openenv.core.env_server`` so that clients import them without
the server half.

>>> from openenv.core._mcp_types import CallToolAction, mcp_action_class
>>> CallToolAction(tool_name="echo_message", arguments={"message": "hi"}).model_dump()
{'type': 'call_tool', 'tool_name': 'echo_message', 'arguments': {'message': 'hi'}}
>>> mcp_action_class(CallToolAction).model_validate({"type": "list_tools"})
ListToolsAction(metadata={}, type='list_tools')
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, model_validator

from openenv.core._models import Action, Observation
from openenv.types import Action as _AnyAction

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
    "mcp_action_class",
]

# Reserved tool names that cannot be used (they are the environment's own API).
RESERVED_TOOL_NAMES = frozenset(["reset", "step", "state", "close"])


class JsonRpcErrorCode(int, Enum):
    """Standard JSON-RPC 2.0 error codes."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    SERVER_ERROR = -32000


class McpMethod(str, Enum):  # noqa: UP042 (OpenEnv's: str() of a member is its name)
    """Supported MCP method names."""

    TOOLS_LIST = "tools/list"
    TOOLS_CALL = "tools/call"


_DEFAULT_MESSAGES = {
    JsonRpcErrorCode.PARSE_ERROR: "Parse error",
    JsonRpcErrorCode.INVALID_REQUEST: "Invalid Request",
    JsonRpcErrorCode.METHOD_NOT_FOUND: "Method not found",
    JsonRpcErrorCode.INVALID_PARAMS: "Invalid params",
    JsonRpcErrorCode.INTERNAL_ERROR: "Internal error",
    JsonRpcErrorCode.SERVER_ERROR: "Server error",
}


class JsonRpcError(BaseModel):
    """JSON-RPC 2.0 error object."""

    model_config = ConfigDict(extra="forbid")

    code: int = Field(description="Error code indicating the error type")
    message: str = Field(description="Short description of the error")
    data: Any | None = Field(default=None, description="Additional error information")

    @classmethod
    def from_code(
        cls, code: JsonRpcErrorCode, message: str | None = None, data: Any = None
    ) -> JsonRpcError:
        """An error from a standard error code."""
        text = message or _DEFAULT_MESSAGES.get(code, "Unknown error")
        return cls(code=code.value, message=text, data=data)


class JsonRpcRequest(BaseModel):
    """JSON-RPC 2.0 request object."""

    model_config = ConfigDict(extra="forbid")

    jsonrpc: Literal["2.0"] = Field(description="JSON-RPC version, must be '2.0'")
    method: str = Field(description="Name of the method to be invoked")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameter values")
    id: str | int | None = Field(default=None, description="Request identifier")


class JsonRpcResponse(BaseModel):
    """JSON-RPC 2.0 response object: ``result`` or ``error``, never both when dumped."""

    model_config = ConfigDict(extra="forbid")

    jsonrpc: Literal["2.0"] = Field(default="2.0", description="JSON-RPC version")
    result: Any | None = Field(default=None, description="Result of the method invocation")
    error: JsonRpcError | None = Field(default=None, description="Error if the call failed")
    id: str | int | None = Field(default=None, description="Request identifier")

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """As OpenEnv's: ``jsonrpc``, ``id``, and ``error`` or else ``result``."""
        data: dict[str, Any] = {"jsonrpc": self.jsonrpc, "id": self.id}
        if self.error is not None:
            data["error"] = self.error.model_dump()
        else:
            data["result"] = self.result
        return data

    def model_dump_json(self, **kwargs: Any) -> str:
        """``model_dump()`` as JSON text."""
        return json.dumps(self.model_dump())

    @classmethod
    def success(cls, result: Any, request_id: str | int | None = None) -> JsonRpcResponse:
        """A success response."""
        return cls(result=result, id=request_id)

    @classmethod
    def error_response(
        cls,
        code: JsonRpcErrorCode,
        message: str | None = None,
        data: Any = None,
        request_id: str | int | None = None,
    ) -> JsonRpcResponse:
        """An error response from a standard error code."""
        return cls(error=JsonRpcError.from_code(code, message, data), id=request_id)


class Tool(BaseModel):
    """A tool's name, description and JSON Schema of its arguments."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Unique identifier for the tool")
    description: str = Field(description="Human-readable description of what the tool does")
    input_schema: dict[str, Any] = Field(description="JSON Schema for the tool's input")


class ToolErrorType(str, Enum):  # noqa: UP042 (as OpenEnv's)
    """Types of errors that can occur during tool execution."""

    EXECUTION_ERROR = "execution_error"
    INVALID_ARGS = "invalid_args"
    TRANSPORT_ERROR = "transport_error"
    TOOL_NOT_FOUND = "tool_not_found"
    TIMEOUT = "timeout"


class ToolError(BaseModel):
    """Why a tool call failed (the framework's error, not a result the tool returned)."""

    model_config = ConfigDict(extra="forbid")

    error_type: ToolErrorType = Field(description="Category of the error")
    message: str = Field(description="Human-readable error message")


class ListToolsAction(Action):
    """Ask for the environment's tools (no ``reset()`` needed first)."""

    type: Literal["list_tools"] = Field(default="list_tools", description="Action type")


class CallToolAction(Action):
    """Call tool ``tool_name`` with ``arguments``."""

    type: Literal["call_tool"] = Field(default="call_tool", description="Action type")
    tool_name: str = Field(description="Name of the tool to call")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments")


class ListToolsObservation(Observation):
    """The answer to a ``ListToolsAction``."""

    tools: list[Tool] = Field(description="List of available tools with their schemas")


class CallToolObservation(Observation):
    """The answer to a ``CallToolAction``: the tool's ``result``, or an ``error``."""

    tool_name: str = Field(description="Name of the tool that was called")
    result: Any = Field(default=None, description="Tool-specific result")
    error: ToolError | None = Field(default=None, description="Framework error if the call failed")


class WSMCPMessage(BaseModel):
    """OpenEnv's WebSocket message carrying an MCP JSON-RPC request."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["mcp"] = Field(default="mcp", description="Message type")
    data: dict[str, Any] = Field(description="JSON-RPC payload (method, params, id)")


class WSMCPResponse(BaseModel):
    """OpenEnv's WebSocket response carrying an MCP JSON-RPC response."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(default="mcp", description="Response type")
    data: dict[str, Any] = Field(description="JSON-RPC response payload")


_MCP_ACTIONS: dict[str, type[Action]] = {
    "list_tools": ListToolsAction,
    "call_tool": CallToolAction,
}


def mcp_action_class(action_cls: type[_AnyAction]) -> type[_AnyAction]:
    """``action_cls``, also taking OpenEnv's MCP actions by their ``type``.

    OpenEnv's server reads ``{"type": "list_tools"}`` and ``{"type":
    "call_tool", ...}`` as its MCP actions when an app's action class is
    ``Action`` or one of them (``create_app(Env, CallToolAction, ...)``); an
    app with any other action class validates as written.
    """
    if action_cls is not Action and action_cls not in _MCP_ACTIONS.values():
        return action_cls

    def dispatch(
        cls: type[_AnyAction], data: Any, handler: ModelWrapValidatorHandler[_AnyAction]
    ) -> Any:
        mcp_cls = _MCP_ACTIONS.get(str(data.get("type"))) if isinstance(data, dict) else None
        return mcp_cls.model_validate(data) if mcp_cls is not None else handler(data)

    validator = model_validator(mode="wrap")(classmethod(dispatch))  # type: ignore[arg-type]
    namespace = {"__module__": action_cls.__module__, "_take_mcp_actions": validator}
    return type(action_cls.__name__, (action_cls,), namespace)
