"""1,000 concurrent tool-calling sessions through the client, against a baseline.

Starts `counter_env` in its own uvicorn process on a free loopback port and,
in the same run, measures:

- baseline: N plain sessions (WebSocketEnvClient): reset, step, state;
- tools: N sessions through RemoteEnv.session(task): reset with the task,
  increment, submit (the same three round trips), each checking reward 1.0;
- mcp: M sessions of the official MCP client: initialize, increment, submit.

All sessions of a kind are started at once with asyncio.gather.
Usage: python benchmarks/tool_sessions.py [--sessions 1000] [--mcp-sessions 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from counter_env import CounterAction, CounterTask
from openenv import RemoteEnv, TaskSpec, WebSocketEnvClient


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(sessions: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "OPENENV_MAX_CONCURRENT_ENVS": str(sessions)}
    cmd = [sys.executable, "-m", "uvicorn", "counter_env.server.app:app", "--port", str(port)]
    server = subprocess.Popen([*cmd, "--log-level", "warning"], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1).raise_for_status()
            return server, url
        except httpx.HTTPError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError("the counter server did not start") from None
            time.sleep(0.1)


async def baseline(url: str, n: int) -> float:
    async def one(i: int) -> None:
        async with WebSocketEnvClient(url, action_cls=CounterAction) as env:
            await env.reset(seed=i)
            await env.step(CounterAction(amount=1))
            await env.state()

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - start


async def tools(url: str, n: int) -> float:
    env = RemoteEnv(url, task_cls=CounterTask)
    tasks = (await env.list_tasks("train"))[:n]

    async def one(task: TaskSpec) -> None:
        assert isinstance(task, CounterTask)
        async with env.session(task) as session:
            await session.call_tool("increment", amount=task.target)
            reward = (await session.call_tool("submit")).reward
            assert reward == 1.0, reward

    start = time.perf_counter()
    await asyncio.gather(*(one(task) for task in tasks))
    return time.perf_counter() - start


async def over_mcp(url: str, n: int, shared: bool) -> float:
    """MCP sessions; each with its own HTTP client (as ``Client(url)`` does) or one shared."""
    http = httpx2.AsyncClient(
        timeout=httpx2.Timeout(30, read=300), limits=httpx2.Limits(max_connections=4 * n)
    )

    async def one() -> None:
        server = streamable_http_client(f"{url}/mcp", http_client=http) if shared else f"{url}/mcp"
        async with Client(server) as mcp:
            await mcp.call_tool("increment", {"amount": 4})  # reset() without a task: target 4
            result = await mcp.call_tool("submit", {})
            assert result.structured_content == {"reward": 1.0, "finished": True}

    async with http:
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--mcp-sessions", type=int, default=50)
    args = parser.parse_args()
    server, url = start_server(max(args.sessions, args.mcp_sessions))
    try:
        n, m = args.sessions, args.mcp_sessions
        rows = [
            ("baseline: reset, step, state", n, asyncio.run(baseline(url, n))),
            ("tools: reset(task), increment, submit", n, asyncio.run(tools(url, n))),
            ("mcp, one HTTP client each", m, asyncio.run(over_mcp(url, m, shared=False))),
            ("mcp, one shared HTTP client", m, asyncio.run(over_mcp(url, m, shared=True))),
        ]
        assert httpx.get(f"{url}/health").json()["active_sessions"] == 0
    finally:
        server.terminate()
        server.wait(30)
    print("| sessions at once | what each does | wall time | sessions/s |")
    print("|---:|---|---:|---:|")
    for what, n, seconds in rows:
        print(f"| {n} | {what} | {seconds:.2f} s | {n / seconds:.0f} |")


if __name__ == "__main__":
    main()
