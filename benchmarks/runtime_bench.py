"""Runtime overhead: echo episodes on every engine vs a hand-written asyncio.gather.

The floors are the least code that plays the same episodes on one event
loop with ``asyncio.gather`` over ``WebSocketEnvClient``s, as many in flight
as the engines get in total: "new" opens a session per episode (what a user
writes first); "reuse" keeps one session per slot and resets it for the next
episode, as the runtime's client pool does, so it is the floor of the
runtime's own overhead. Each engine then plays the same episodes through
``Runners``; the ratios are its episodes/s over each floor's (averaged over
their two runs, first and last, which also shows drift on a shared machine).
Ray and Spark are started, and every engine's workers warmed up, before the
clock starts; start-up is reported on its own.

    python benchmarks/runtime_bench.py                   # 2,000 episodes x 20 steps
    python benchmarks/runtime_bench.py --episodes 200    # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from openenv import WebSocketEnvClient
from openenv.cli.demo import serve_subprocess
from openenv.runtime import EpisodeSession, RunConfig, Runners, Task
from openenv.runtime.episode import run_coroutine


async def play(session: EpisodeSession) -> int:
    """The benchmark's agent: reset, then ``max_steps`` echo steps."""
    await session.reset()
    steps = session.max_steps or 20
    for k in range(steps):
        await session.step({"message": f"{session.task.id}/{k}"})
    return steps


async def floor_new(url: str, episodes: int, steps: int, in_flight: int) -> None:
    """The same episodes by hand: asyncio.gather, a semaphore, a new session each."""
    gate = asyncio.Semaphore(in_flight)

    async def episode(i: int) -> None:
        async with gate, WebSocketEnvClient(url) as env:
            await env.reset(seed=i)
            for k in range(steps):
                await env.step({"message": f"t{i}/{k}"})

    await asyncio.gather(*(episode(i) for i in range(episodes)))


async def floor_reuse(url: str, episodes: int, steps: int, in_flight: int) -> None:
    """The same episodes by hand: ``in_flight`` sessions, each reset for its next episode."""
    pending = iter(range(episodes))

    async def slot() -> None:
        async with WebSocketEnvClient(url) as env:
            for i in pending:
                await env.reset(seed=i)
                for k in range(steps):
                    await env.step({"message": f"t{i}/{k}"})

    await asyncio.gather(*(slot() for _ in range(in_flight)))


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--in-flight", type=int, default=64, help="episodes in flight in total")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--engines", default="local,processes,ray,spark")
    args = parser.parse_args()
    engines = args.engines.split(",")
    per_worker = max(1, args.in_flight // args.workers)
    configs = {
        "local": RunConfig(max_concurrency=args.in_flight),
        "processes": RunConfig(worker_num=args.workers, max_concurrency=per_worker),
        "ray": RunConfig(engine_name="ray", worker_num=args.workers, max_concurrency=per_worker),
        "spark": RunConfig(
            engine_name="spark", worker_num=args.workers, max_concurrency=per_worker
        ),
    }
    rows: list[tuple[str, float, float]] = []  # name, seconds, start-up seconds
    ray_dir = tempfile.mkdtemp(prefix="oe-ray-")
    with serve_subprocess("echo_env.server.app:app", None, max_sessions=4 * args.in_flight) as url:
        tasks = [
            Task(id=f"t{i}", env=url, agent=play, seed=i, max_steps=args.steps)
            for i in range(args.episodes)
        ]

        def floors(when: str) -> None:
            for name, floor in (("new", floor_new), ("reuse", floor_reuse)):
                started = time.perf_counter()
                run_coroutine(floor(url, args.episodes, args.steps, args.in_flight))
                seconds = time.perf_counter() - started
                rows.append((f"floor: gather, {name} sessions ({when})", seconds, 0.0))

        floors("first")
        for name in engines:
            startup = 0.0
            if name == "ray":
                startup = timed(lambda: start_ray(ray_dir, args.workers))
            if name == "spark":
                from openenv.runtime.spark import local_context

                startup = timed(lambda: local_context(args.workers))
            # Warm-up: worker processes start and import openenv before the clock runs.
            startup += timed(lambda n=name: Runners.sync_run_task(tasks[:8], configs[n]))
            started = time.perf_counter()
            results = Runners.sync_run_task(tasks, configs[name])
            seconds = time.perf_counter() - started
            failed = [r for r in results if not r.ok]
            if failed:
                raise SystemExit(f"{name}: {len(failed)} episodes failed, e.g. {failed[0].error}")
            rows.append((name, seconds, startup))
        floors("last")
    shutil.rmtree(ray_dir, ignore_errors=True)
    report(rows, args)


def start_ray(temp_dir: str, workers: int) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",
        num_cpus=workers,
        include_dashboard=False,
        object_store_memory=256 * 2**20,
        _temp_dir=temp_dir,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )


def report(rows: list[tuple[str, float, float]], args: argparse.Namespace) -> None:
    new = statistics.mean(args.episodes / s for name, s, _ in rows if "new sessions" in name)
    reuse = statistics.mean(args.episodes / s for name, s, _ in rows if "reuse sessions" in name)
    print(
        f"\n{args.episodes} episodes x {args.steps} steps, {args.in_flight} in flight "
        f"({args.workers} workers x {max(1, args.in_flight // args.workers)} for multi-worker "
        f"engines), echo server in one uvicorn process, {os.cpu_count()} cores\n"
    )
    print(
        "| run | wall s | episodes/s | steps/s | vs floor (new) | vs floor (reuse) | start-up s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, seconds, startup in rows:
        rate = args.episodes / seconds
        print(
            f"| {name} | {seconds:.2f} | {rate:,.0f} | {rate * args.steps:,.0f} "
            f"| {rate / new:.2f}x | {rate / reuse:.2f}x | {startup:.1f} |"
        )


if __name__ == "__main__":
    main()
