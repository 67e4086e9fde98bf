"""Runners on Ray and Spark as a driver program uses them: runs side by side,
results as they come, long chains and big answers; each task gets exactly one
result, and no run waits on what another left behind."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from runtime_agents import echo_agent

from echo_env.server.environment import EchoEnvironment
from openenv.runtime import RunConfig, Runners, Task

# Generous: an echo episode takes milliseconds; the bound only ends a stalled test.
SLACK = 60


def echo_tasks(prefix: str, count: int, agent: Any = echo_agent) -> list[Task]:
    env = functools.partial(EchoEnvironment, max_steps=3)
    return [Task(id=f"{prefix}{i}", env=env, agent=agent) for i in range(count)]


def test_two_ray_runs_of_different_sizes_at_once_both_finish(ray_cluster: None) -> None:
    # On 2 CPUs, 2 workers ask for a whole CPU each and 4 for half of one: the
    # runs' actors wait for each other's room. The first run to end kept its
    # actors idle where no one would release them, holding every CPU, and the
    # other run's actors were never placed: it waited for ever (here, until
    # its start_timeout failed every one of its tasks).
    async def both() -> list[list[str]]:
        runs = [
            Runners.run_task(
                echo_tasks(prefix, 4),
                RunConfig(
                    engine_name="ray",
                    worker_num=workers,
                    start_timeout=SLACK,
                    progress=False,
                ),
            )
            for prefix, workers in (("a", 2), ("b", 4))
        ]
        results = await asyncio.gather(*runs)
        return [[f"{r.task_id}:{r.status.value}" for r in run] for run in results]

    assert asyncio.run(both()) == [
        [f"a{i}:ok" for i in range(4)],
        [f"b{i}:ok" for i in range(4)],
    ]
