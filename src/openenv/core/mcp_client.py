"""``openenv.core.mcp_client``: OpenEnv 0.10's ``MCPToolClient``, onto openenv's ``@tool``\\s.

OpenEnv's tool-calling clients list tools and call them by name with keyword
arguments, getting the tool's value back. Here those calls travel as
openenv's own ``list_tools`` / ``call_tool`` frames, so they reach the
``@tool`` methods of any openenv environment. OpenEnv's production mode
(``/mcp`` JSON-RPC) is served by ``create_app(..., mcp=True)`` for real MCP
clients instead.
"""

from __future__ import annotations

from typing import Any

from openenv.client._base import AnyObservation
from openenv.client.async_ import EnvClient
from openenv.client.loop_aware import loop_aware
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import Action, State

__all__ = ["MCPToolClient"]


class MCPToolClient(EnvClient[Action, AnyObservation, State]):
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

    @loop_aware
    async def list_tools(self, use_cache: bool = True) -> list[ToolInfo]:
        """The environment's tools (``name``, ``description``, ``input_schema``)."""
        if not use_cache or self._tools_cache is None:
            self._tools_cache = self.decode_tools(await self._request("list_tools"))
        return self._tools_cache

    @loop_aware
    async def call_tool(self, name: str, /, **kwargs: Any) -> Any:  # type: ignore[override]
        """Call tool ``name`` with ``kwargs`` as its arguments; return its value."""
        data = self.encode_tool_call(name, None, kwargs)
        return _value(self.decode_tool_result(await self._request("call_tool", data)))


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
