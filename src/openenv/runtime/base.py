"""The engine interface, and the table that names the built-in engines.

An engine has one job: run a list of tasks and return one ``TaskResult`` per
task, in input order, calling ``on_result`` as each one finishes. Engines are
named by ``"module:Class"`` strings and imported only when chosen, so Ray and
pyspark are never imported unless their engine is used.
"""

from __future__ import annotations

import abc
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openenv.errors import EngineError
from openenv.runtime.task import Task, TaskError, TaskResult, TaskStatus

if TYPE_CHECKING:
    from openenv.runtime.config import RunConfig

__all__ = [
    "ENGINES",
    "BatchSettings",
    "ResultCallback",
    "RuntimeEngine",
    "collect",
    "engine_class",
    "failed_result",
    "finish",
]

ResultCallback = Callable[[int, TaskResult], None]

# Engine name -> "module:Class", and the extra that provides its dependency.
ENGINES: dict[str, str] = {
    "local": "openenv.runtime.local:LocalRuntime",
    "ray": "openenv.runtime.ray:RayRuntime",
    "spark": "openenv.runtime.spark:SparkRuntime",
}
_EXTRAS: dict[str, tuple[str, str]] = {"ray": ("ray", "Ray"), "spark": ("pyspark", "pyspark")}


class RuntimeEngine(abc.ABC):
    """Runs tasks somewhere; subclass it and pass the class as ``RunConfig(cls=...)``.

    >>> from openenv.runtime import LocalRuntime, RunConfig
    >>> class Chatty(LocalRuntime):
    ...     async def run(self, tasks, on_result):
    ...         print(f"running {len(tasks)} tasks")
    ...         return await super().run(tasks, on_result)
    >>> RunConfig(cls=Chatty).cls.__name__
    'Chatty'
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    @abc.abstractmethod
    async def run(self, tasks: Sequence[Task], on_result: ResultCallback) -> list[TaskResult]:
        """Run every task; return exactly one result per task, in input order.

        Call ``on_result(index, result)`` from the caller's event loop as each
        task finishes (it drives the progress display). A task's failure is its
        own ``error`` result, never an exception that aborts the others.
        """


@dataclass(frozen=True)
class BatchSettings:
    """What a worker needs to know of the ``RunConfig`` to run its share of tasks."""

    max_concurrency: int = 64
    timeout: float | None = None
    retries: int = 2
    retry_backoff: float = 0.1
    sequence_dependent: bool = False
    record: str | None = None
    multiplex: bool = True
    start_timeout: float | None = None

    @classmethod
    def from_config(cls, config: RunConfig) -> BatchSettings:
        return cls(
            max_concurrency=config.max_concurrency,
            timeout=config.timeout,
            retries=config.retries,
            retry_backoff=config.retry_backoff,
            sequence_dependent=config.sequence_dependent,
            record=config.record,
            multiplex=config.multiplex,
            start_timeout=config.start_timeout,
        )


def engine_class(config: RunConfig) -> type[RuntimeEngine]:
    """The engine class a config names, imported now.

    Raises:
        EngineError: The engine's extra is not installed; the message says
            which one (``pip install 'openenv-scale[ray]'``).
    """
    if config.cls is not None:
        return config.cls
    name = config.engine_name.value
    module_name, _, attr = ENGINES[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if name in _EXTRAS and missing == _EXTRAS[name][0]:
            raise EngineError(
                f"the {name} engine needs {_EXTRAS[name][1]}, which is not installed: "
                f"pip install 'openenv-scale[{name}]'"
            ) from exc
        raise
    engine: type[RuntimeEngine] = getattr(module, attr)
    return engine


def failed_result(task_id: str, exc_type: str, message: str, started_at: float) -> TaskResult:
    """An ``error`` result for a task that a broken worker never finished."""
    return TaskResult(
        task_id=task_id,
        status=TaskStatus.ERROR,
        error=TaskError(type=exc_type, message=message),
        started_at=started_at,
        ended_at=time.time(),
        attempts=1,
    )


def collect(
    tasks: Sequence[Task], on_result: ResultCallback
) -> tuple[list[TaskResult | None], ResultCallback]:
    """A slot per task, and a callback that fills it (first result wins) and passes it on."""
    results: list[TaskResult | None] = [None] * len(tasks)

    def record(index: int, result: TaskResult) -> None:
        if results[index] is None:
            results[index] = result
            on_result(index, result)

    return results, record


def finish(results: list[TaskResult | None], tasks: Sequence[Task]) -> list[TaskResult]:
    """The filled slots; a slot left empty is an engine bug, reported as that task's error."""
    now = time.time()
    return [
        r
        if r is not None
        else failed_result(t.id, "EngineError", "the engine finished without running it", now)
        for r, t in zip(results, tasks, strict=True)
    ]
