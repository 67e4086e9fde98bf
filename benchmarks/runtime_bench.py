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
clock starts; start-up is reported on its own: the first run of 8 episodes
(cold: the cluster, the workers) and the same 8 again after the big run (the
engine kept warm in this program).

    python benchmarks/runtime_bench.py                   # 10,000 episodes x 5 steps, 256 at once
    python benchmarks/runtime_bench.py --episodes 200    # a quick look
    python benchmarks/runtime_bench.py --engines processes,processes-timeout  # what a timeout costs
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any, NamedTuple

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


def cpu_seconds() -> float:
    """CPU used by this process and its reaped children (local worker processes).

    Ray's and Spark's workers are not children of this process: their CPU is not counted.
    """
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Row(NamedTuple):
    name: str
    seconds: float
    cpu: float  # client-side CPU seconds, see cpu_seconds()
    startup: float  # the first small run: the engine's cold start
    again: float  # the same small run after the big one: a warm engine


def measure(name: str, fn: Callable[[], Any], startup: float = 0.0) -> Row:
    cpu, started = cpu_seconds(), time.perf_counter()
    fn()
    return Row(name, time.perf_counter() - started, cpu_seconds() - cpu, startup, 0.0)


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--in-flight", type=int, default=256, help="episodes in flight in total")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--engines", default="local,local-v1,processes,processes-v1,ray,spark")
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
        # The same without protocol v2: a connection per session, as before.
        "local-v1": RunConfig(max_concurrency=args.in_flight, multiplex=False),
        "processes-v1": RunConfig(
            worker_num=args.workers, max_concurrency=per_worker, multiplex=False
        ),
        # The same with a task timeout: each worker says when an episode starts
        # (a frame up the channel) and the driver moves its watch over it.
        "processes-timeout": RunConfig(
            worker_num=args.workers, max_concurrency=per_worker, timeout=600
        ),
    }
    rows: list[Row] = []
    ray_dir = tempfile.mkdtemp(prefix="oe-ray-")
    with serve_subprocess("echo_env.server.app:app", None, max_sessions=4 * args.in_flight) as url:
        tasks = [
            Task(id=f"t{i}", env=url, agent=play, seed=i, max_steps=args.steps)
            for i in range(args.episodes)
        ]

        def floors(when: str) -> None:
            for name, floor in (("new", floor_new), ("reuse", floor_reuse)):
                coro = floor(url, args.episodes, args.steps, args.in_flight)
                label = f"floor: gather, {name} sessions ({when})"
                rows.append(measure(label, functools.partial(run_coroutine, coro)))

        floors("first")
        for name in engines:
            startup = 0.0
            if name == "ray":
                startup = timed(lambda: start_ray(ray_dir, args.workers))
            if name == "spark":
                from openenv.runtime.spark import local_context

                startup = timed(lambda: local_context(args.workers))
            # Warm-up: worker processes start and import openenv before the clock runs.
            small = functools.partial(Runners.sync_run_task, tasks[:8], configs[name])
            startup += timed(small)
            results: list[Any] = []
            run = functools.partial(Runners.sync_run_task, tasks, configs[name])
            row = measure(name, lambda r=run, out=results: out.extend(r()), startup)
            rows.append(row._replace(again=timed(small)))  # a later run in this program
            failed = [r for r in results if not r.ok]
            if failed:
                raise SystemExit(f"{name}: {len(failed)} episodes failed, e.g. {failed[0].error}")
        floors("last")
    if "ray" in engines:
        import ray

        ray.shutdown()  # before removing its folder, which it writes to as it stops
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


def report(rows: list[Row], args: argparse.Namespace) -> None:
    def rate(row: Row) -> float:
        return args.episodes / row.seconds

    new = statistics.mean(rate(r) for r in rows if "new sessions" in r.name)
    reuse = statistics.mean(rate(r) for r in rows if "reuse sessions" in r.name)
    print(
        f"\n{args.episodes} episodes x {args.steps} steps, {args.in_flight} in flight "
        f"({args.workers} workers x {max(1, args.in_flight // args.workers)} for multi-worker "
        f"engines), echo server in one uvicorn process, {os.cpu_count()} cores\n"
    )
    print(
        "| run | wall s | episodes/s | vs floor (new) | vs floor (reuse) "
        "| client CPU ms/episode | first 8 episodes s (cold) | again s (warm) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        outside = " (+ workers)" if row.name in {"ray", "spark"} else ""
        print(
            f"| {row.name} | {row.seconds:.2f} | {rate(row):,.0f} | {rate(row) / new:.2f}x "
            f"| {rate(row) / reuse:.2f}x | {row.cpu / args.episodes * 1000:.2f}{outside} "
            f"| {row.startup:.2f} | {row.again:.2f} |"
        )


if __name__ == "__main__":
    main()
