"""Hundreds of coding_env sessions running programs at once, against baselines.

Starts `coding_env` in its own uvicorn process on a free loopback port and,
in the same run, measures:

- idle: the latency of `GET /health` with nothing running (the loop's baseline);
- one at a time: a single session running `print(i)` programs back to back
  (the cost of one sandboxed run: supervisor + program, two interpreters);
- N at once, short: N sessions each running `print(i)`, all started together;
- N at once, sleeping: N sessions each running a program that sleeps S seconds.
  Run one at a time this would take N x S seconds; the wall time shows how
  many run at once.

While the N-session rows run, another process polls `GET /health` every
50 ms: its latency shows whether the server's event loop ever waits. The N
rows run twice, against a server whose programs run at nice 19 (the default)
and one at nice 0 (`CODING_ENV_NICE=0`), each in its own uvicorn process.
Usage: python benchmarks/coding_sessions.py [--sessions 200] [--sleep 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable

import httpx

from coding_env import CodeAction, CodingEnv


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


POLLER = """
import sys, time, httpx
latencies = []
with httpx.Client(base_url=sys.argv[1], timeout=120) as http:
    while sys.stdin.readline() == "poll\\n":
        start = time.perf_counter()
        http.get("/health").raise_for_status()
        latencies.append(time.perf_counter() - start)
print(",".join(map(str, latencies)))
"""


def start_server(sessions: int, nice: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "OPENENV_MAX_CONCURRENT_ENVS": str(sessions),
        "CODING_ENV_NICE": str(nice),
        "CODING_ENV_TIMEOUT": "300",  # this measures speed, not the wall-clock limit
    }
    cmd = [sys.executable, "-m", "uvicorn", "coding_env.server.app:app", "--port", str(port)]
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
                raise RuntimeError("the coding server did not start") from None
            time.sleep(0.1)


async def run_program(url: str, code: str, expected: str) -> None:
    async with CodingEnv(url, message_timeout=300) as env:
        await env.reset(seed=0)
        execution = (await env.step(CodeAction(code=code))).observation.execution
        assert execution is not None, "no execution result"
        assert (execution.status, execution.stdout) == ("ok", expected), execution


async def while_polling(url: str, work: Awaitable[object]) -> tuple[float, list[float]]:
    """Run ``work`` while another process polls /health every 50 ms."""
    poller = await asyncio.create_subprocess_exec(
        sys.executable, "-c", POLLER, url, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    stdin = poller.stdin
    assert stdin is not None

    async def tick() -> None:
        while True:
            stdin.write(b"poll\n")
            await stdin.drain()
            await asyncio.sleep(0.05)

    ticking = asyncio.create_task(tick())
    start = time.perf_counter()
    await work
    elapsed = time.perf_counter() - start
    ticking.cancel()
    stdin.write(b"stop\n")
    output, _ = await poller.communicate()
    return elapsed, [float(x) for x in output.decode().strip().split(",") if x]


def describe(latencies: list[float]) -> str:
    ms = sorted(x * 1000 for x in latencies)
    return f"/health p50 {statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms ({len(ms)} polls)"


async def one_at_a_time(url: str, runs: int = 20) -> float:
    start = time.perf_counter()
    async with CodingEnv(url) as env:
        await env.reset(seed=0)
        for i in range(runs):
            execution = (await env.step(CodeAction(code=f"print({i})"))).observation.execution
            assert execution is not None
            assert execution.stdout == f"{i}\n", execution
    return (time.perf_counter() - start) / runs


async def at_once(url: str, sessions: int, sleep: float) -> None:
    short = asyncio.gather(*(run_program(url, f"print({i})", f"{i}\n") for i in range(sessions)))
    elapsed, polled = await while_polling(url, short)
    print(
        f"  {sessions} at once, print: {elapsed:.2f} s ({sessions / elapsed:.0f} runs/s); "
        f"{describe(polled)}"
    )
    code = f"import time\ntime.sleep({sleep})\nprint('done')"
    sleeping = asyncio.gather(*(run_program(url, code, "done\n") for _ in range(sessions)))
    elapsed, polled = await while_polling(url, sleeping)
    print(
        f"  {sessions} at once, sleep {sleep:g} s: {elapsed:.2f} s "
        f"(one at a time: {sessions * sleep:.0f} s); {describe(polled)}"
    )


async def main(sessions: int, sleep: float) -> None:
    for nice in (19, 0):
        server, url = start_server(sessions, nice)
        try:
            print(f"programs at nice {nice}:")
            _, idle = await while_polling(url, asyncio.sleep(2))  # nothing else running
            print(f"  idle: {describe(idle)}")
            per_run = await one_at_a_time(url)
            print(f"  one at a time: {per_run * 1000:.0f} ms per run")
            await at_once(url, sessions, sleep)
            async with httpx.AsyncClient() as http:
                health = (await http.get(f"{url}/health")).json()
            assert health["active_sessions"] == 0, health
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=2.0)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.sleep))
