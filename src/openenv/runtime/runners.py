"""``Runners`` and ``exec_tasks``: run tasks on the engine a ``RunConfig`` names."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from openenv.errors import EngineError
from openenv.runtime.base import engine_class
from openenv.runtime.config import RunConfig
from openenv.runtime.episode import run_coroutine
from openenv.runtime.progress import ProgressDisplay
from openenv.runtime.task import Task, TaskResult

__all__ = ["Runners", "exec_tasks"]


async def exec_tasks(tasks: Iterable[Task], run_conf: RunConfig | None = None) -> list[TaskResult]:
    """Run tasks on the configured engine; one ``TaskResult`` per task, in input order.

    A task's failure (the agent raising, its timeout, a connection failing
    after every retry) is that task's ``error`` or ``timeout`` result; it
    never aborts the run or hides another task's result.

    Raises:
        ValueError: Two tasks share an ``id``.
        EngineError: The engine's extra is not installed, or the engine broke
            its contract (a custom ``cls`` returning the wrong results).
    """
    config = run_conf or RunConfig()
    tasks = list(tasks)
    duplicates = sorted(i for i, n in Counter(t.id for t in tasks).items() if n > 1)
    if duplicates:
        raise ValueError(f"task ids must be unique; repeated: {', '.join(duplicates[:5])}")
    if not tasks:
        return []
    cls = engine_class(config)
    engine = cls(config)
    reported = [False] * len(tasks)
    with ProgressDisplay(len(tasks), config.progress) as progress:

        def on_result(index: int, result: TaskResult) -> None:
            if not reported[index]:
                reported[index] = True
                progress.update(result)

        results = await engine.run(tasks, on_result)
        _check(cls, tasks, results)
        for index, result in enumerate(results):
            on_result(index, result)
    return list(results)


def _check(cls: type, tasks: list[Task], results: object) -> None:
    name = f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(results, list) or len(results) != len(tasks):
        got = len(results) if isinstance(results, list) else type(results).__name__
        raise EngineError(
            f"engine {name} returned {got} results for {len(tasks)} tasks; "
            f"it must return a list with one TaskResult per task, in input order"
        )
    for task, result in zip(tasks, results, strict=True):
        if not isinstance(result, TaskResult) or result.task_id != task.id:
            found = getattr(result, "task_id", type(result).__name__)
            raise EngineError(
                f"engine {name} returned {found!r} where the result of task {task.id!r} "
                f"belongs; results must be TaskResults in input order"
            )


class Runners:
    """Run many episodes, on any engine, with one ``RunConfig``.

    >>> from openenv.runtime import Runners, RunConfig, Task
    >>> from echo_env.server.environment import EchoEnvironment
    >>> async def say_hi(session):
    ...     await session.reset()
    ...     result = await session.step({"message": "hi"})
    ...     return result.observation.echoed_message
    >>> tasks = [Task(id=f"t{i}", env=EchoEnvironment, agent=say_hi) for i in range(3)]
    >>> results = Runners.sync_run_task(tasks, RunConfig(max_concurrency=2))
    >>> [(r.task_id, r.status.value, r.value, r.steps) for r in results]
    [('t0', 'ok', 'hi', 1), ('t1', 'ok', 'hi', 1), ('t2', 'ok', 'hi', 1)]
    """

    @staticmethod
    async def run_task(
        tasks: Iterable[Task], run_conf: RunConfig | None = None
    ) -> list[TaskResult]:
        """Run tasks; see ``exec_tasks``."""
        return await exec_tasks(tasks, run_conf)

    @staticmethod
    def sync_run_task(tasks: Iterable[Task], run_conf: RunConfig | None = None) -> list[TaskResult]:
        """Run tasks and block until all are done; works inside a running event loop too.

        Inside a running loop (a notebook, an async test) the run gets its own
        loop on a helper thread; the calling loop is blocked until it finishes.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_coroutine(exec_tasks(tasks, run_conf))
        with ThreadPoolExecutor(1, thread_name_prefix="openenv-runner") as pool:
            return pool.submit(run_coroutine, exec_tasks(tasks, run_conf)).result()
