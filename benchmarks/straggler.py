"""Stragglers: 64 tasks, 8 of them ten times slower, on 4 workers of one slot each.

Each task's agent waits (``asyncio.sleep``) 0.1 s, or 1 s for every eighth
task, so the measured wall time is all dispatch: how the tasks reach the
workers. It is compared with, in the same run:

- **ideal**: the total work divided by the workers (no schedule beats it);
- **in order, as workers free up**: the best a queue that hands out tasks in
  their order can do (list scheduling, computed);
- **split up front**: what dealing the tasks round-robin into fixed shares
  costs (the runtime before dynamic dispatch; computed: the slowest share).

Each engine plays a few tasks first, so its workers are up before the clock runs.

    python benchmarks/straggler.py                       # processes and ray
    python benchmarks/straggler.py --engines processes   # without Ray
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import logging
import os
import shutil
import tempfile
import time

from openenv.runtime import EpisodeSession, RunConfig, Runners, Task


async def wait(session: EpisodeSession) -> float:
    """The benchmark's agent: no environment, only its input's seconds of waiting."""
    seconds: float = session.input
    await asyncio.sleep(seconds)
    return seconds


def in_order(durations: list[float], workers: int) -> float:
    """The makespan of handing tasks out in order, each to the first free worker."""
    free = [0.0] * workers
    for duration in durations:
        heapq.heappush(free, heapq.heappop(free) + duration)
    return max(free)


def split(durations: list[float], workers: int) -> float:
    """The makespan of round-robin shares, fixed up front."""
    return max(sum(durations[w::workers]) for w in range(workers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--short", type=float, default=0.1, help="seconds of most tasks")
    parser.add_argument("--engines", default="processes,ray")
    args = parser.parse_args()
    durations = [args.short * (10 if i % 8 == 0 else 1) for i in range(args.tasks)]
    tasks = [Task(id=f"t{i}", input=d, agent=wait) for i, d in enumerate(durations)]
    ideal = sum(durations) / args.workers
    rows = [
        ("ideal: total work / workers", ideal),
        ("in order, as workers free up (computed)", in_order(durations, args.workers)),
        ("split up front, round-robin (computed)", split(durations, args.workers)),
    ]
    ray_dir = tempfile.mkdtemp(prefix="oe-ray-")
    for name in args.engines.split(","):
        engine = "local" if name == "processes" else name
        if name == "ray":
            import ray

            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(
                address="local",
                num_cpus=os.cpu_count() or 2,
                include_dashboard=False,
                object_store_memory=128 * 2**20,
                _temp_dir=ray_dir,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        config = RunConfig(
            engine_name=engine, worker_num=args.workers, max_concurrency=1, progress=False
        )
        warm = [Task(id=f"w{i}", input=0.0, agent=wait) for i in range(2 * args.workers)]
        Runners.sync_run_task(warm, config)
        started = time.perf_counter()
        results = Runners.sync_run_task(tasks, config)
        rows.append((f"{name}: measured", time.perf_counter() - started))
        failed = [r for r in results if not r.ok]
        if failed:
            raise SystemExit(f"{name}: {len(failed)} tasks failed, e.g. {failed[0].error}")
    if "ray" in args.engines:
        import ray

        ray.shutdown()
    shutil.rmtree(ray_dir, ignore_errors=True)
    print(
        f"\n{args.tasks} tasks ({args.tasks // 8} ten times slower), {args.workers} workers "
        f"x 1 slot, {os.cpu_count()} cores\n"
    )
    print("| schedule | wall s | vs ideal |")
    print("|---|---:|---:|")
    for label, seconds in rows:
        print(f"| {label} | {seconds:.2f} | {seconds / ideal:.2f}x |")


if __name__ == "__main__":
    main()
