"""Run by OpenEnv 0.10's own Python, in its own virtual environment (not ours).

Plays the MCP echo environment at argv[1] over ``/ws`` with OpenEnv's real
``EnvClient``, sending ``ListToolsAction`` / ``CallToolAction`` through
``step`` with the payloads and parsing of OpenEnv's own ``MCPToolClient``
(whose constructor allows only its ``/mcp`` production mode). Prints one JSON
line of what it saw.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import openenv
from openenv.core.env_client import EnvClient
from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
from openenv.core.mcp_client import MCPClientBase


class McpOverWs(EnvClient[Any, Any, Any]):
    _step_payload = MCPClientBase._step_payload
    _parse_result = MCPClientBase._parse_result
    _parse_state = MCPClientBase._parse_state


def main() -> None:
    with McpOverWs(base_url=sys.argv[1]).sync() as env:
        env.reset()
        tools = env.step(ListToolsAction()).observation.tools
        echoed = env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
        sized = env.step(CallToolAction(tool_name="echo_with_length", arguments={"message": "abc"}))
        missing = env.step(CallToolAction(tool_name="nope", arguments={}))
        state = env.state()
    print(
        json.dumps(
            {
                "module": openenv.__file__,
                "observation_types": [
                    type(echoed.observation).__name__,
                    type(missing.observation).__name__,
                ],
                "tools": [tool.name for tool in tools],
                "echoed": echoed.observation.result["data"],
                "sized": sized.observation.result["data"],
                "missing": missing.observation.error.error_type.value,
                "steps": state.step_count,
            }
        )
    )


if __name__ == "__main__":
    main()
