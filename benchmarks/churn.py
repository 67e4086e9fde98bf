"""Churn: open, step and end 100,000 sessions every which way; count what leaks.

Each session connects, resets and steps, then ends one of three ways: a clean
``close`` message, an abrupt disconnect (TCP reset, no close frame) after a
reply, or a kill mid-step (the step is sent and the socket dropped before the
reply). The server runs in its own process; its RSS, thread count and open
file descriptors are read from /proc after a warm-up and again at the end.

    .venv/bin/python benchmarks/churn.py --sessions 100000 --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parents[1]
STEP = json.dumps({"type": "step", "data": {"message": "churn"}})


def proc_stats(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def health(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        data: dict[str, int] = json.loads(response.read())
        return data


async def one_session(url: str, ending: str) -> None:
    ws = await connect(url, compression=None, open_timeout=30)
    try:
        await ws.send('{"type": "reset"}')
        await ws.recv()
        for _ in range(random.randint(1, 3)):
            await ws.send(STEP)
            await ws.recv()
        if ending == "clean":
            await ws.send('{"type": "close"}')
            await ws.wait_closed()
        elif ending == "abrupt":
            ws.transport.abort()
        else:  # killed mid-step
            await ws.send(STEP)
            ws.transport.abort()
    finally:
        if ending == "clean":
            await ws.close()


async def churn(url: str, sessions: int, concurrency: int) -> Counter[str]:
    endings = ("clean", "abrupt", "killed")
    outcomes: Counter[str] = Counter()
    queue = iter(range(sessions))

    async def worker() -> None:
        for i in queue:
            ending = endings[i % 3]
            try:
                await one_session(url, ending)
                outcomes[ending] += 1
            except Exception as exc:
                outcomes[f"client error: {type(exc).__name__}"] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "OPENENV_MAX_CONCURRENT_ENVS": str(args.concurrency * 2)}
    code = (
        "from openenv import serve; "
        f"serve('server.app:app', app_dir={str(ROOT / 'envs' / 'echo_env')!r}, "
        f"port={port}, log_level='error', backlog=4096)"
    )
    server = subprocess.Popen([sys.executable, "-c", code], env=env)
    url = f"http://127.0.0.1:{port}"
    ws_url = f"ws://127.0.0.1:{port}/ws"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health(url)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("server did not start") from None
                time.sleep(0.05)
        asyncio.run(churn(ws_url, args.warmup, args.concurrency))
        before = proc_stats(server.pid)
        started = time.perf_counter()
        # Two halves: the thread pools are bounded but grow lazily with load, so
        # the second half (pools at their working size) is where a leak would show.
        outcomes = asyncio.run(churn(ws_url, args.sessions // 2, args.concurrency))
        middle = proc_stats(server.pid)
        outcomes += asyncio.run(churn(ws_url, args.sessions - args.sessions // 2, args.concurrency))
        elapsed = time.perf_counter() - started
        deadline = time.monotonic() + 30
        while (state := health(url))["active_sessions"] and time.monotonic() < deadline:
            time.sleep(0.05)
        after = proc_stats(server.pid)
    finally:
        server.terminate()
        server.wait(30)
    result = {
        "sessions": args.sessions,
        "concurrency": args.concurrency,
        "seconds": round(elapsed, 1),
        "sessions_per_s": round(args.sessions / elapsed),
        "outcomes": dict(outcomes),
        "leaked_slots": state["active_sessions"],
        "before": before,
        "middle": middle,
        "after": after,
        "growth_pct": {k: round(100 * (after[k] - before[k]) / before[k], 1) for k in before},
        "second_half_growth_pct": {
            k: round(100 * (after[k] - middle[k]) / middle[k], 1) for k in before
        },
        "server_exit_code": server.returncode,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"churn: {args.sessions:,} sessions in {elapsed:.1f}s "
        f"({result['sessions_per_s']:,}/s), concurrency {args.concurrency}"
    )
    print(f"  endings: {dict(outcomes)}")
    print(f"  leaked slots: {state['active_sessions']}")
    for key in before:
        print(
            f"  {key:8} before {before[key]:>8,}  halfway {middle[key]:>8,}  "
            f"after {after[key]:>8,}  ({result['growth_pct'][key]:+.1f}% in all, "
            f"{result['second_half_growth_pct'][key]:+.1f}% in the second half)"
        )
    print(f"  server exit code after SIGTERM: {server.returncode}")


if __name__ == "__main__":
    main()
