"""What a `ServerPool` costs: the same load through a pool of one server and straight at it.

Two scenarios against one `openenv serve envs/echo_env` in a child process
(`make bench-pool`), each run A/B/A/B/... so drift hits both sides alike:

- **steady**: `openenv bench` with C closed-loop sessions for D seconds, the
  URL given plain or as a one-server pool (the pool chooses the server once
  per session; steps go straight over the socket either way): steps/s.
- **episodes**: `Runners` (local engine) playing N short episodes (connect,
  reset, 10 steps, close) with `Task(env=URL)` against `Task(env=ServerPool([URL]))`:
  the pool places every session and counts it back: episodes/s.

Run from the repository root with the project's venv:
`.venv/bin/python benchmarks/pool.py [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from workers import OPENENV, server

from echo_env.models import EchoAction
from openenv import RunConfig, Runners, ServerPool, Task
from openenv.runtime import EpisodeSession

ROOT = Path(__file__).resolve().parent.parent
ENV_DIR = ROOT / "envs" / "echo_env"


def steady(target: str, sessions: int, duration: float) -> float:
    argv = [str(OPENENV), "bench", target, "--sessions", str(sessions)]
    argv += ["--duration", str(duration), "--action", '{"message": "hi"}', "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    report: dict[str, Any] = json.loads(out.stdout)
    if report["sessions_ok"] != sessions:
        raise RuntimeError(f"bench sessions failed: {report['errors']}")
    return float(report["steps_per_s"])


async def ten_steps(session: EpisodeSession) -> None:
    await session.reset()
    for _ in range(10):
        await session.step(EchoAction(message="hi"))


def episodes(env: str | ServerPool, count: int, concurrency: int) -> float:
    tasks = [Task(id=f"t{i}", env=env, agent=ten_steps) for i in range(count)]
    config = RunConfig(engine_name="local", worker_num=1, max_concurrency=concurrency)
    started = time.perf_counter()
    results = Runners.sync_run_task(tasks, config)
    elapsed = time.perf_counter() - started
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes failed: {failed[0].error}")
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--episodes", type=int, default=2000)
    args = parser.parse_args()
    direct_steps, pooled_steps, direct_eps, pooled_eps = [], [], [], []
    sys.path.insert(0, str(ENV_DIR))
    with server(1, 256, "server.app:app", cwd=ENV_DIR) as (url, _):
        for _ in range(args.rounds):
            direct_steps.append(steady(url, args.sessions, args.duration))
            pooled_steps.append(steady(f"{url},", args.sessions, args.duration))
            direct_eps.append(episodes(url, args.episodes, args.sessions))
            pooled_eps.append(episodes(ServerPool([url]), args.episodes, args.sessions))

    def row(name: str, direct: list[float], pooled: list[float], unit: str) -> str:
        a, b = statistics.median(direct), statistics.median(pooled)
        return f"| {name} | {a:,.0f} {unit} | {b:,.0f} {unit} | {100 * (b - a) / a:+.1f}% |"

    print(
        "\n".join(
            [
                f"**Pool overhead** (echo_env, one `openenv serve` worker, medians of "
                f"{args.rounds} alternating rounds):",
                "",
                "| load | straight at the server | through a one-server `ServerPool` | change |",
                "|---|---|---|---|",
                row(
                    f"`openenv bench` C={args.sessions}, {args.duration:.0f} s",
                    direct_steps,
                    pooled_steps,
                    "steps/s",
                ),
                row(
                    f"Runners, {args.episodes:,} episodes of 10 steps, C={args.sessions}",
                    direct_eps,
                    pooled_eps,
                    "episodes/s",
                ),
            ]
        )
    )


if __name__ == "__main__":
    main()
