"""Send tasks to another process one at a time, and results back, losing none on the way.

Tasks travel cloudpickled (closures and lambdas included), each in its own
``Parcel``. Every task is pickled before the run starts, so an agent that
cannot travel fails the run at once, naming the task and the reason. A
parcel that cannot be unpickled on the worker (say, the agent's module is
not importable there) and a result whose value cannot be pickled each
become that task's ``error`` result.

``EpisodeWorker`` is what runs on the far side, in a local worker process,
a Ray actor or a Spark task alike.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import cloudpickle

from openenv.runtime import recording
from openenv.runtime.base import BatchSettings, failed_result
from openenv.runtime.episode import run_one
from openenv.runtime.pool import ClientPool
from openenv.runtime.task import Task, TaskError, TaskResult, TaskStatus

__all__ = [
    "EpisodeWorker",
    "Parcel",
    "decode_result",
    "encode_result",
    "pack_tasks",
]


@dataclass(frozen=True)
class Parcel:
    """One task on its way to a worker, with what the driver knows of its past."""

    index: int
    task_id: str
    blob: bytes  # cloudpickle of the Task
    attempts_before: int = 0  # attempts used by earlier dispatches (lost workers)
    free_attempts: int = 0  # of those, lost for another task's sake: not against its retries
    time_left: float | None = None  # of the task's timeout; None: all of it
    previous: TaskResult | None = None  # sequence-dependent runs


def pack_tasks(tasks: Sequence[Task]) -> list[bytes]:
    """Pickle every task, or fail before anything runs.

    Raises:
        TypeError: A task cannot be pickled; the message names it and says why.
    """
    blobs = []
    for task in tasks:
        try:
            blobs.append(bytes(cloudpickle.dumps(task)))
        except Exception as exc:
            raise TypeError(
                f"task {task.id!r} cannot be pickled to send it to a worker "
                f"({_culprit(task)} holds something that cannot travel to another "
                f"process): {type(exc).__name__}: {exc}; run it in process (engine_name="
                f"'local' with worker_num=1, or reuse_process=True) or make it picklable"
            ) from exc
    return blobs


def _culprit(task: Task) -> str:
    """Which of the task's fields cannot be pickled, for the error."""
    for field in ("agent", "env", "input", "reset_kwargs", "client_cls"):
        value = getattr(task, field)
        try:
            cloudpickle.dumps(value)
        except Exception:
            return f"its agent {_name(value)}" if field == "agent" else f"its {field}"
    return f"its agent {_name(task.agent)}, or its env,"


def _name(obj: object) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


class EpisodeWorker:
    """The far side: plays parcels on one event loop, sharing a client pool per run."""

    def __init__(self) -> None:
        self.settings = BatchSettings()
        self._pool: ClientPool | None = None
        self._playing = 0

    def begin(self, settings: BatchSettings, sys_path: Sequence[str]) -> None:
        """Start a run: its settings, and the driver's import path.

        On the same machine, modules the driver can import (a notebook's
        folder, a test directory) become importable here too.
        """
        self.settings = settings
        for path in sys_path:
            if path not in sys.path:
                sys.path.append(path)

    @property
    def pool(self) -> ClientPool:
        if self._pool is None:
            self._pool = ClientPool(
                self.settings.max_concurrency, multiplex=self.settings.multiplex
            )
        return self._pool

    @property
    def busy(self) -> bool:
        """Some parcel is being played."""
        return self._playing > 0

    async def play(self, parcel: Parcel, started: Callable[[], None] | None = None) -> bytes:
        """Play one parcel; its result, encoded.

        ``started`` is called as the episode's clock starts, if the task has a
        timeout: the task is unpickled (its agent's module imported) by then.
        """
        self._playing += 1
        try:
            return await self._play(parcel, started)
        finally:
            self._playing -= 1

    async def _play(self, parcel: Parcel, started: Callable[[], None] | None) -> bytes:
        try:
            task: Task = cloudpickle.loads(parcel.blob)
        except Exception as exc:
            message = f"the worker could not unpickle the task: {type(exc).__name__}: {exc}"
            result = failed_result(parcel.task_id, "WorkerError", message, time.time())
            return encode_result(parcel.index, result)
        if started is not None and parcel.time_left is not None:
            started()
        result = await run_one(
            task,
            self.settings,
            self.pool,
            parcel.previous,
            attempts_before=parcel.attempts_before,
            free_attempts=parcel.free_attempts,
            time_left=parcel.time_left,
        )
        return encode_result(parcel.index, result)

    async def end(self) -> None:
        """End a run: close the sessions kept for reuse, so none outlives it."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()
        if self.settings.record is not None:
            recording.flush()


def encode_result(index: int, result: TaskResult) -> bytes:
    """Pickle a result beside its index and task id.

    A value that cannot be pickled turns the result into an error here; one
    that cannot be unpickled on the other side does so in ``decode_result``.
    """
    return bytes(cloudpickle.dumps((index, result.task_id, _dumps(result))))


def _dumps(result: TaskResult) -> bytes:
    try:
        return bytes(cloudpickle.dumps(result))
    except Exception as exc:
        message = (
            f"the agent returned a {type(result.value).__name__} that cannot be pickled "
            f"to send it back from the worker: {exc}"
        )
        error = TaskError(type=type(exc).__name__, message=message)
        return bytes(
            cloudpickle.dumps(replace(result, status=TaskStatus.ERROR, value=None, error=error))
        )


def decode_result(data: bytes) -> tuple[int, TaskResult]:
    index, task_id, blob = cloudpickle.loads(data)
    try:
        result: TaskResult = cloudpickle.loads(blob)
    except BaseException as exc:
        # Unpickling runs the result's own code (a __reduce__ may call sys.exit):
        # what it raises is this task's failure. Raised on, a SystemExit killed
        # the driver's loop, and this run and every later one waited for ever.
        # A KeyboardInterrupt on the main thread may be the user's Ctrl-C
        # (signals arrive only there): that one is not ours to keep.
        if (
            isinstance(exc, KeyboardInterrupt)
            and threading.current_thread() is threading.main_thread()
        ):
            raise
        message = (
            f"the worker's result could not be unpickled here "
            f"(is the agent's return type importable?): {type(exc).__name__}: {exc}"
        )
        result = failed_result(task_id, "ResultUnpicklingError", message, time.time())
    return index, result
