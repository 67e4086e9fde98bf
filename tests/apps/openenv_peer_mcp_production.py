"""Run by OpenEnv 0.10's own Python, in its own virtual environment (not ours).

Uses OpenEnv's own ``MCPToolClient`` as its README shows (it has only its
production mode: JSON-RPC POSTs to ``/mcp``, opened by ``openenv/session/create``)
against the server at argv[1], and prints one JSON line of what each use got.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import openenv
from openenv.core.mcp_client import MCPToolClient


def failure(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


async def main(url: str) -> None:
    seen: dict[str, Any] = {"module": openenv.__file__}
    env = MCPToolClient(base_url=url)
    try:
        seen["tools"] = [tool.name for tool in await env.list_tools()]
        try:
            seen["called"] = await env.call_tool("increment", amount=2)
        except Exception as exc:
            seen["call_failed"] = failure(exc)
    finally:
        await env.close()
    try:
        async with MCPToolClient(base_url=url) as connected:
            seen["connected"] = await connected.list_tools()
    except Exception as exc:
        seen["connect_failed"] = failure(exc)
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
