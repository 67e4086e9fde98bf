"""One server, every core: `openenv serve --workers N` measured on this machine.

Three scenarios, all on `envs/benchmark_env` (`make bench-workers`):

- **cpu**: a `def step` that burns 1 ms of CPU, C=64 closed-loop sessions,
  1 worker against 2 workers in the same run: steps/s and server CPU per step.
  Nothing is pinned: two workers need both cores, and the load's share is
  small (one step costs the server ~1 ms, the load generator ~20 us).
- **spread**: 512 sessions opened at once on 2 workers; how many land on
  each worker (the observation names the process that served it).
- **scale**: N sessions (default 32,768) of the `async def step` app on
  2 workers: connect, reset, one step sleeping 10 s, close. The load is
  split over several `openenv bench` processes, each connecting to its own
  loopback address (127.0.0.1, 127.0.0.2, ...) so that each has its own
  ~28,000 ephemeral ports; success rate and latency percentiles.

Run from the repository root with the project's venv:
`.venv/bin/python benchmarks/workers.py [--skip cpu,spread,scale]`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV_DIR = ROOT / "envs" / "benchmark_env"
PY = Path(sys.executable)
OPENENV = PY.parent / "openenv"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(
    workers: int, max_sessions: int, app: str, host: str = "127.0.0.1", cwd: Path = ENV_DIR
) -> Iterator[tuple[str, int]]:
    """`openenv.serve(app, workers=...)` in a child process; yields its URL and pid."""
    port = free_port()
    code = (
        "import openenv; openenv.serve("
        f"{app!r}, host={host!r}, port={port}, workers={workers}, app_dir='.', "
        "log_level='warning', backlog=8192)"
    )
    env = {**os.environ, "OPENENV_MAX_CONCURRENT_ENVS": str(max_sessions)}
    proc = subprocess.Popen([str(PY), "-c", code], cwd=cwd, env=env, preexec_fn=_lift_nofile)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _lift_nofile() -> None:
    """Let the server hold one socket per session (root may raise the hard limit)."""
    want = 200_000
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/health", timeout=1) as reply,
        ):
            if reply.status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"no /health from {url} in {timeout}s")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants (the supervisor and its workers)."""
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(stat[11]) + int(stat[12])) / CLK_TCK
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                stack.extend(int(c) for c in children)
    return total


def bench(url: str, sessions: int, action: dict[str, Any], *more: str) -> dict[str, Any]:
    argv = [str(OPENENV), "bench", url, "--sessions", str(sessions)]
    argv += ["--action", json.dumps(action), "--json", "--client", "picows", *more]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if not out.stdout.strip():
        raise RuntimeError(f"bench failed: {out.stderr}")
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def cpu_scenario(duration: float, sessions: int) -> list[str]:
    rows = []
    action = {"seconds": 0.001, "work": "cpu"}
    results: dict[int, dict[str, float]] = {}
    for workers in (1, 2):
        with server(workers, sessions, "server.app:app") as (url, pid):
            bench(url, sessions, action, "--duration", "1")  # warm every worker
            cpu0, t0 = tree_cpu(pid), time.perf_counter()
            report = bench(url, sessions, action, "--duration", str(duration), "--warmup")
            cpu = (tree_cpu(pid) - cpu0) / (time.perf_counter() - t0)
        results[workers] = {"rate": report["steps_per_s"], "cpu": cpu}
        rows.append(
            f"| {workers} | {report['steps_per_s']:,.0f} | {cpu:.2f} | "
            f"{report['latency_ms']['p50']:.1f} | {report['latency_ms']['p99']:.1f} | "
            f"{report['sessions_ok']} |"
        )
    ratio = results[2]["rate"] / results[1]["rate"]
    return [
        f"**CPU-bound step** (benchmark_env `def step`, 1 ms of CPU, C={sessions}, "
        f"{duration:.0f} s): 2 workers make **{ratio:.2f}x** the steps/s of 1.",
        "",
        "| workers | steps/s | server CPU (cores) | p50 ms | p99 ms | sessions ok |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


async def _spread(url: str, sessions: int) -> collections.Counter[int]:
    from benchmark_env.client import BenchmarkEnv
    from benchmark_env.models import BenchAction

    clients = [BenchmarkEnv(url) for _ in range(sessions)]
    await asyncio.gather(*(c.connect() for c in clients))
    try:
        results = await asyncio.gather(*(c.step(BenchAction()) for c in clients))
        return collections.Counter(r.observation.pid for r in results)
    finally:
        await asyncio.gather(*(c.close() for c in clients))


def spread_scenario(sessions: int) -> list[str]:
    with server(2, sessions, "server.app:app") as (url, _):
        counts = asyncio.run(_spread(url, sessions))
    shares = ", ".join(f"{n}" for n in sorted(counts.values(), reverse=True))
    return [f"**Spread**: {sessions} sessions opened at once on 2 workers landed {shares}."]


def scale_scenario(sessions: int, seconds: float, loaders: int) -> list[str]:
    action = {"seconds": seconds}
    with server(2, sessions, "server.app:async_app", host="0.0.0.0") as (url, _):
        port = url.rsplit(":", 1)[1]
        share = [sessions // loaders + (i < sessions % loaders) for i in range(loaders)]
        argv = []
        for i, n in enumerate(share):
            target = f"http://127.0.0.{i + 1}:{port}"
            argv.append(
                [
                    *(str(OPENENV), "bench", target, "--sessions", str(n), "--steps", "1"),
                    *("--action", json.dumps(action), "--json", "--client", "picows"),
                    *("--connect-timeout", "120", "--reply-timeout", str(seconds + 120)),
                ]
            )
        started = time.perf_counter()
        procs = [subprocess.Popen(a, stdout=subprocess.PIPE, text=True) for a in argv]
        reports = [json.loads(p.communicate()[0]) for p in procs]
        wall = time.perf_counter() - started
    ok = sum(r["sessions_ok"] for r in reports)
    errors: collections.Counter[str] = collections.Counter()
    for r in reports:
        errors.update(r.get("errors", {}))
    p99 = max(r["latency_ms"]["p99"] for r in reports) / 1000
    p50 = max(r["latency_ms"]["p50"] for r in reports) / 1000
    connect_p99 = max(r["connect_ms"]["p99"] for r in reports) / 1000
    return [
        f"**Scale**: {sessions:,} sessions of benchmark_env (`async def step` sleeping "
        f"{seconds:.0f} s) on one `openenv serve --workers 2`, load from {loaders} processes: "
        f"**{ok:,} ok ({100 * ok / sessions:.2f}%)**, step latency p50 {p50:.1f} s, "
        f"p99 {p99:.1f} s, connect p99 {connect_p99:.1f} s, wall {wall:.1f} s; "
        f"errors {dict(errors) or 'none'}.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip", default="", help="comma list of: cpu,spread,scale")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--cpu-sessions", type=int, default=64)
    parser.add_argument("--spread-sessions", type=int, default=512)
    parser.add_argument("--scale-sessions", type=int, default=32768)
    parser.add_argument("--scale-loaders", type=int, default=4)
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    lines: list[str] = []
    if "cpu" not in skip:
        lines += [*cpu_scenario(args.duration, args.cpu_sessions), ""]
    if "spread" not in skip:
        lines += [*spread_scenario(args.spread_sessions), ""]
    if "scale" not in skip:
        lines += scale_scenario(args.scale_sessions, 10.0, args.scale_loaders)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
