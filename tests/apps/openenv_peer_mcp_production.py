"""Run by OpenEnv 0.10's own Python, in its own virtual environment (not ours).

Uses OpenEnv's own ``MCPToolClient`` as its README shows (it has only its
production mode: JSON-RPC POSTs to ``/mcp``, opened by ``openenv/session/create``,
and ``/ws?session_id=`` for reset and step) against the server at argv[1]
(a counter environment), and prints one JSON line of what each use got.

argv[2] says what to do: ``play`` (async and sync, tools and steps on one
counter, errors, close), ``vanish`` (open a session, call a tool, exit
without closing) or ``full`` (the server is full: what connecting raises).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx

import openenv
from openenv.core.env_server.types import Action
from openenv.core.mcp_client import MCPToolClient


class Add(Action):
    """The counter environment's step action, as OpenEnv's client sends it."""

    amount: int


def failure(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def active(url: str) -> int:
    count: int = httpx.get(f"{url}/health").json()["active_sessions"]
    return count


async def play(url: str, seen: dict[str, Any]) -> None:
    async with MCPToolClient(base_url=url) as env:
        seen["connected_active"] = active(url)
        tools = await env.list_tools()
        seen["tools"] = [tool.name for tool in tools]
        seen["increment_schema"] = next(t.input_schema for t in tools if t.name == "increment")
        reset = await env.reset()
        seen["reset_value"] = reset.observation.value
        seen["called"] = await env.call_tool("increment", amount=2)
        stepped = await env.step(Add(amount=3))
        seen["stepped_value"] = stepped.observation.value
        seen["got_value"] = await env.call_tool("get_value")
        seen["state_steps"] = (await env.state()).step_count
        for name, call in {
            "unknown_tool": env.call_tool("decrement", amount=1),
            "bad_arguments": env.call_tool("increment", amount="many"),
        }.items():
            try:
                seen[name] = await call
            except Exception as exc:
                seen[name] = failure(exc)
        seen["after_errors"] = await env.call_tool("get_value")
    seen["closed_active"] = active(url)
    # Tools only, no WebSocket: close() ends it too.
    env = MCPToolClient(base_url=url)
    seen["listed_only"] = [tool.name for tool in await env.list_tools()]
    seen["listed_active"] = active(url)
    await env.close()
    seen["listed_closed_active"] = active(url)


def play_sync(url: str, seen: dict[str, Any]) -> None:
    with MCPToolClient(base_url=url).sync() as env:
        env.reset()
        env.call_tool("increment", amount=4)
        seen["sync_stepped"] = env.step(Add(amount=1)).observation.value
        seen["sync_value"] = env.call_tool("get_value")
    seen["sync_closed_active"] = active(url)


async def vanish(url: str, seen: dict[str, Any]) -> None:
    env = MCPToolClient(base_url=url)
    seen["called"] = await env.call_tool("increment", amount=1)
    seen["vanished_active"] = active(url)
    # No close(): the process ends, its session left on the server.


async def full(url: str, seen: dict[str, Any]) -> None:
    env = MCPToolClient(base_url=url)
    try:
        await env.connect()
        seen["connected"] = True
    except Exception as exc:
        seen["connect_failed"] = failure(exc)
    finally:
        await env.close()


def main(url: str, mode: str) -> None:
    seen: dict[str, Any] = {"module": openenv.__file__}
    if mode == "play":
        asyncio.run(play(url, seen))
        play_sync(url, seen)
    elif mode == "vanish":
        asyncio.run(vanish(url, seen))
    else:
        asyncio.run(full(url, seen))
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
