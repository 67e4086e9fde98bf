"""``openenv.core.env_server.mcp_environment``: OpenEnv 0.10's ``MCPEnvironment``.

An OpenEnv tool-calling environment builds a ``fastmcp.FastMCP`` server with
``@mcp.tool`` functions and hands it to ``MCPEnvironment``. Its ``step`` (and
``step_async``, which openenv's server awaits) answers ``ListToolsAction`` and
``CallToolAction`` by calling that server in-process through
``fastmcp.Client(server)``, and hands every other action to ``_step_impl``,
as OpenEnv's does. ``fastmcp`` is imported when one is made (``pip install
fastmcp``, or ``openenv-scale[mcp]``).

>>> from fastmcp import FastMCP
>>> from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
>>> from openenv.core.env_server.types import Observation, State
>>> class Adder(MCPEnvironment):
...     def __init__(self):
...         mcp = FastMCP("adder")
...         @mcp.tool
...         def add(a: int, b: int) -> int:
...             "Add two numbers."
...             return a + b
...         super().__init__(mcp)
...     def reset(self, seed=None, episode_id=None, **kwargs):
...         return Observation()
...     def _step_impl(self, action, timeout_s=None, **kwargs):
...         return Observation(metadata={"unknown": type(action).__name__})
...     @property
...     def state(self):
...         return State()
>>> env = Adder()
>>> [tool.name for tool in env.step(ListToolsAction()).tools]
['add']
>>> env.step(CallToolAction(tool_name="add", arguments={"a": 2, "b": 3})).result.data
5
>>> env.step(CallToolAction(tool_name="sub")).error.error_type.value
'tool_not_found'
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from abc import abstractmethod
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from openenv.core._models import Action, Observation
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (
    RESERVED_TOOL_NAMES,
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
    ToolErrorType,
)

__all__ = ["MCP_TOOL_CALL_TIMEOUT", "VALID_MODES", "MCPEnvironment", "get_server_tools"]

MCP_TOOL_CALL_TIMEOUT = 30.0
VALID_MODES = {"production", "simulation"}

_T = TypeVar("_T")


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to the end from sync code, inside a running event loop or not."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # This thread's loop is busy running us: the coroutine gets a loop of its own.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _fastmcp() -> Any:
    try:
        import fastmcp
    except ImportError as exc:
        raise ImportError(
            "MCPEnvironment serves a fastmcp.FastMCP server, and fastmcp is not installed: "
            "pip install fastmcp (or pip install 'openenv-scale[mcp]')"
        ) from exc
    return fastmcp


def get_server_tools(mcp_server: Any) -> dict[str, Any]:
    """The tools of a FastMCP server, by name."""
    return {tool.name: tool for tool in _run(mcp_server.list_tools())}


def _tool_from_server_tool(tool: Any) -> Tool:
    schema = getattr(tool, "input_schema", None) or getattr(tool, "parameters", None) or {}
    return Tool(name=tool.name, description=tool.description or "", input_schema=schema)


def _error_type(message: str) -> ToolErrorType:
    # OpenEnv sorts fastmcp's errors by their text, and so its clients see these kinds.
    text = message.lower()
    if "not found" in text or "unknown tool" in text:
        return ToolErrorType.TOOL_NOT_FOUND
    if "invalid" in text or "argument" in text:
        return ToolErrorType.INVALID_ARGS
    return ToolErrorType.EXECUTION_ERROR


def _mode_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """OpenEnv's JSON Schema of a mode-specific tool's parameters."""
    kinds = {int: "integer", "int": "integer", float: "number", "float": "number"}
    kinds.update({bool: "boolean", "bool": "boolean"})
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(func).parameters.items():
        properties[name] = {"type": kinds.get(param.annotation, "string")}
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


class MCPEnvironment(Environment[Any, Any, Any]):
    """An environment whose tools are a FastMCP server's; see the module docstring.

    Subclasses write ``reset``, ``state`` and ``_step_impl`` (for actions that
    are not MCP actions), as on OpenEnv. Tools named ``reset``, ``step``,
    ``state`` or ``close`` are refused with ``ValueError``.
    """

    def __init__(self, mcp_server: Any, transform: Any | None = None) -> None:
        fastmcp = _fastmcp()
        super().__init__(transform=transform)
        self._validate_tool_names(mcp_server)
        self.mcp_server: Any = mcp_server
        self.mcp_client: Any = fastmcp.Client(mcp_server)
        # {tool name: {mode: function}}; mode None: every mode (also on the FastMCP server).
        self._mode_tools: defaultdict[str, dict[str | None, Callable[..., Any]]]
        self._mode_tools = defaultdict(dict)
        self._mode_tool_schemas: defaultdict[str, dict[str | None, dict[str, Any]]]
        self._mode_tool_schemas = defaultdict(dict)

    def _require_mcp_client(self) -> Any:
        if self.mcp_client is None:
            raise RuntimeError("MCP client is not available; environment is closed")
        return self.mcp_client

    def _require_mcp_server(self) -> Any:
        if self.mcp_server is None:
            raise RuntimeError("MCP server is not available; environment is closed")
        return self.mcp_server

    @property
    def supports_code_mode(self) -> bool:
        """Whether ``execute_code`` is available (always, as on OpenEnv)."""
        return True

    def _get_server_tools(self, mcp_server: Any) -> dict[str, Any]:
        return get_server_tools(mcp_server)

    def get_callables(self) -> dict[str, Callable[..., Any]]:
        """The tools as plain Python functions, for code mode (this mode's only)."""
        current_mode = getattr(self, "_mode", None)
        callables: dict[str, Callable[..., Any]] = {}
        for name, tool in self._get_server_tools(self.mcp_server).items():
            if callable(getattr(tool, "fn", None)):
                callables[name] = tool.fn
        for name, funcs in self._mode_tools.items():
            if None in funcs:
                callables.setdefault(name, funcs[None])
            elif current_mode in funcs:
                callables[name] = funcs[current_mode]
        return callables

    def execute_code(self, code: str) -> Observation:
        """Run ``code`` with the tools as functions; its ``result`` variable is returned.

        As OpenEnv's, in ``metadata["result"]`` (or ``metadata["error"]``). The
        code runs in this process, unsandboxed: it is the environment author's
        to offer.
        """
        namespace: dict[str, Any] = dict(self.get_callables())
        results: dict[str, Any] = {}
        try:
            exec(code, namespace, results)
        except SyntaxError as exc:
            return Observation(done=False, reward=0.0, metadata={"error": f"Syntax error: {exc}"})
        except Exception as exc:
            return Observation(done=False, reward=0.0, metadata={"error": str(exc)})
        return Observation(done=False, reward=0.0, metadata={"result": results.get("result")})

    def _validate_tool_names(self, mcp_server: Any) -> None:
        conflicts = set(self._get_server_tools(mcp_server)) & RESERVED_TOOL_NAMES
        if conflicts:
            raise ValueError(
                f"MCP tools cannot use reserved names: {sorted(conflicts)}. "
                f"Reserved names are: {sorted(RESERVED_TOOL_NAMES)}"
            )

    def tool(self, mode: str | None = None) -> Callable[[Callable[..., Any]], Any]:
        """Register a tool for every mode (``mode=None``: on the FastMCP server),
        or for ``"production"`` or ``"simulation"`` only."""
        if mode is not None and mode not in VALID_MODES:
            raise ValueError(
                f"Invalid mode '{mode}'. Mode must be 'production', 'simulation', or None."
            )

        def decorator(func: Callable[..., Any]) -> Any:
            name = func.__name__
            if name in RESERVED_TOOL_NAMES:
                raise ValueError(
                    f"Tool name '{name}' is reserved and cannot be used. "
                    f"Reserved names are: {sorted(RESERVED_TOOL_NAMES)}"
                )
            self._mode_tools[name][mode] = func
            if mode is None:
                return self._require_mcp_server().tool()(func)
            self._mode_tool_schemas[name][mode] = {
                "name": name,
                "description": func.__doc__ or "",
                "input_schema": _mode_schema(func),
            }
            return func

        return decorator

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """MCP actions answered by the FastMCP server; any other goes to ``_step_impl``."""
        if isinstance(action, ListToolsAction):
            return _run(self._async_handle_list_tools())
        if isinstance(action, CallToolAction):
            return _run(self._async_handle_call_tool(action, timeout_s=timeout_s))
        return self._step_impl(action, timeout_s=timeout_s, **kwargs)

    async def step_async(
        self, action: Action, timeout_s: float | None = None, **kwargs: Any
    ) -> Observation:
        """``step`` on the server's event loop; ``_step_impl`` runs in a worker thread."""
        if isinstance(action, ListToolsAction):
            return await self._async_handle_list_tools()
        if isinstance(action, CallToolAction):
            return await self._async_handle_call_tool(action, timeout_s=timeout_s)
        return await asyncio.to_thread(self._step_impl, action, timeout_s=timeout_s, **kwargs)

    async def _async_list_tools(self) -> list[Any]:
        async with self._require_mcp_client() as client:
            return list(await client.list_tools())

    async def _async_call_tool(self, tool_name: str, arguments: dict[str, Any]) -> Any:
        async with self._require_mcp_client() as client:
            return await client.call_tool(tool_name, arguments)

    async def _async_handle_list_tools(self) -> ListToolsObservation:
        current_mode = getattr(self, "_mode", None)
        try:
            listed = await self._async_list_tools()
        except Exception as exc:
            return ListToolsObservation(
                tools=[], metadata={"error": str(exc), "error_type": "list_tools_failed"}
            )
        tools = [_tool_from_server_tool(t) for t in listed if t.name not in self._mode_tool_schemas]
        for schemas in self._mode_tool_schemas.values():
            schema = schemas[None] if None in schemas else schemas.get(current_mode)
            if schema is not None:
                tools.append(Tool(**schema))
        return ListToolsObservation(tools=tools)

    async def _async_handle_call_tool(
        self, action: CallToolAction, timeout_s: float | None = None
    ) -> CallToolObservation:
        timeout = timeout_s if timeout_s is not None else MCP_TOOL_CALL_TIMEOUT
        name = action.tool_name
        if name in self._mode_tools:
            return await self._call_mode_tool(action)
        try:
            result = await asyncio.wait_for(self._async_call_tool(name, action.arguments), timeout)
        except TimeoutError:
            message = f"Tool '{name}' timed out after {timeout} seconds"
            return _failed(name, ToolErrorType.TIMEOUT, message)
        except Exception as exc:
            return _failed(name, _error_type(str(exc)), str(exc))
        return CallToolObservation(tool_name=name, result=result)

    async def _call_mode_tool(self, action: CallToolAction) -> CallToolObservation:
        name = action.tool_name
        current_mode = getattr(self, "_mode", None)
        funcs = self._mode_tools[name]
        func = funcs.get(None) or funcs.get(current_mode)
        if func is None:
            message = f"Tool '{name}' not available in {current_mode} mode"
            return _failed(name, ToolErrorType.TOOL_NOT_FOUND, message)
        try:
            value = func(**action.arguments)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            return _failed(name, ToolErrorType.EXECUTION_ERROR, str(exc))
        # What fastmcp's client gives for a tool's value, as OpenEnv builds it.
        from fastmcp.client.client import CallToolResult
        from mcp.types import TextContent

        result = CallToolResult(
            content=[TextContent(type="text", text=str(value))],
            structured_content={"result": value},
            meta=None,
            data=value,
            is_error=False,
        )
        return CallToolObservation(tool_name=name, result=result)

    @abstractmethod
    def _step_impl(
        self, action: Action, timeout_s: float | None = None, **kwargs: Any
    ) -> Observation:
        """Answer an action that is not an MCP action."""

    def close(self) -> None:
        """Drop the FastMCP server and client (subclasses call ``super().close()``)."""
        self.mcp_client = None
        self.mcp_server = None


def _failed(name: str, kind: ToolErrorType, message: str) -> CallToolObservation:
    return CallToolObservation(
        tool_name=name, result=None, error=ToolError(error_type=kind, message=message)
    )
