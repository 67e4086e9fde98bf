"""``openenv.core.mcp_client``: OpenEnv 0.10's ``MCPToolClient``, onto openenv.

OpenEnv's tool-calling clients list tools and call them by name with keyword
arguments, getting the tool's value back. Here those calls travel as
openenv's own ``list_tools`` / ``call_tool`` frames, so they reach the
``@tool`` methods of any openenv environment. An environment with no such
tools that takes OpenEnv's MCP actions (an ``MCPEnvironment`` on FastMCP) is
asked through ``step(ListToolsAction())`` and ``step(CallToolAction(...))``
instead, as OpenEnv's client asks one over its WebSocket; ``step`` gives
OpenEnv's ``ListToolsObservation`` / ``CallToolObservation`` for those.
OpenEnv's production mode (``/mcp`` JSON-RPC) is served by ``create_app(...,
mcp=True)`` for real MCP clients instead.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

from openenv.client.loop_aware import loop_aware
from openenv.core._mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
)
from openenv.core._models import Action, Observation, State
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.errors import EnvValidationError, UnknownToolError
from openenv.tools import ToolInfo, ToolOutput

__all__ = ["GenericMCPObservation", "MCPToolClient"]


class GenericMCPObservation(Observation):
    """Any other observation, with the environment's own fields kept."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)


class MCPToolClient(EnvClient[Action, Observation, State]):
    """Tools by name: ``env.call_tool("increment", amount=2)`` returns the tool's value.

    A tool that returns JSON gives that value back, one that returns text
    gives the text, anything else (images, several blocks) the whole
    ``ToolOutput``. Like every openenv client it blocks outside an event loop
    and is awaitable inside one.

    >>> from openenv.core.mcp_client import MCPToolClient
    >>> MCPToolClient(base_url="http://localhost:8000").base_url
    'http://localhost:8000'
    """

    def __init__(self, base_url: str, **options: Any) -> None:
        super().__init__(base_url, **options)
        self._tools_cache: list[ToolInfo] | None = None
        # Whether the tools are an MCPEnvironment's, reached through step().
        self._through_step = False

    @loop_aware
    async def list_tools(self, use_cache: bool = True) -> list[ToolInfo]:
        """The environment's tools (``name``, ``description``, ``input_schema``)."""
        if not use_cache or self._tools_cache is None:
            tools = self.decode_tools(await self._request("list_tools"))
            self._tools_cache = tools or await self._tools_through_step()
        return self._tools_cache

    @loop_aware
    async def call_tool(self, name: str, /, **kwargs: Any) -> Any:  # type: ignore[override]
        """Call tool ``name`` with ``kwargs`` as its arguments; return its value.

        A tool of an ``MCPEnvironment`` that fails raises ``RuntimeError``
        saying why, as OpenEnv's client does.
        """
        if not self._through_step:
            data = self.encode_tool_call(name, None, kwargs)
            try:
                return _value(self.decode_tool_result(await self._request("call_tool", data)))
            except UnknownToolError as exc:
                if exc.tools:  # it has openenv tools, and not this one
                    raise
                try:
                    result = await self.step(CallToolAction(tool_name=name, arguments=kwargs))
                except EnvValidationError:
                    raise exc from None
                self._through_step = True
        else:
            result = await self.step(CallToolAction(tool_name=name, arguments=kwargs))
        return _mcp_value(name, result.observation)

    async def _tools_through_step(self) -> list[ToolInfo]:
        try:
            result = await self.step(ListToolsAction())
        except EnvValidationError:  # it takes no MCP actions: it has no tools
            return []
        if not isinstance(result.observation, ListToolsObservation):
            return []
        self._through_step = True
        return [ToolInfo.model_validate(t.model_dump()) for t in result.observation.tools]

    def _step_payload(self, action: Action) -> dict[str, Any]:
        if isinstance(action, ListToolsAction):
            return {"type": "list_tools"}
        if isinstance(action, CallToolAction):
            return {
                "type": "call_tool",
                "tool_name": action.tool_name,
                "arguments": action.arguments,
            }
        return action.model_dump(mode="json")

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Observation]:
        """OpenEnv's: MCP observations by their fields, any other kept as sent."""
        data = dict(payload.get("observation", {}))
        common = {
            "done": payload.get("done", False),
            "reward": payload.get("reward"),
            "metadata": payload.get("metadata", data.get("metadata", {})),
        }
        observation: Observation
        if "tools" in data:
            tools = [_tool(t) for t in data["tools"]]
            observation = ListToolsObservation(tools=tools, **common)
        elif "tool_name" in data:
            error = ToolError(**data["error"]) if data.get("error") else None
            observation = CallToolObservation(
                tool_name=data["tool_name"], result=data.get("result"), error=error, **common
            )
        else:
            fields = {k: v for k, v in data.items() if k not in common}
            observation = GenericMCPObservation(**fields, **common)
        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )


def _tool(payload: dict[str, Any]) -> Tool:
    return Tool(
        name=payload.get("name", ""),
        description=payload.get("description", ""),
        input_schema=payload.get("input_schema", payload.get("inputSchema", {})),
    )


def _mcp_value(name: str, observation: Observation) -> Any:
    if not isinstance(observation, CallToolObservation):
        return observation
    if observation.error is not None:
        raise RuntimeError(
            f"Tool '{name}' failed: {observation.error.message} "
            f"(type: {observation.error.error_type.value})"
        )
    result = observation.result
    if isinstance(result, dict) and "data" in result:
        return result["data"]
    return getattr(result, "data", result)


def _value(output: ToolOutput) -> Any:
    if len(output.content) == 1:
        block = output.content[0]
        if block.type == "json":
            return block.data
        if block.type == "text":
            return block.text
    if not output.content:
        return None
    return output
