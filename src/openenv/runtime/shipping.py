"""Send tasks to another process and results back, losing none on the way.

Tasks travel cloudpickled (closures and lambdas included). A task that cannot
be pickled, a batch that cannot be unpickled on the worker (say, the agent's
module is not importable there), and a result whose value cannot be pickled
each become that task's ``error`` result instead of sinking the whole batch.
"""

from __future__ import annotations

import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import cloudpickle

from openenv.runtime.base import BatchSettings, failed_result
from openenv.runtime.episode import run_batch, run_coroutine
from openenv.runtime.task import Task, TaskError, TaskResult, TaskStatus

__all__ = ["FRAME_HEADER", "Batch", "decode_results", "encode_results", "pack", "run_packed"]

Pairs = list[tuple[int, TaskResult]]

# Frames on a worker's result stream: this header (the length), then the bytes.
FRAME_HEADER = struct.Struct(">I")


@dataclass(frozen=True)
class Batch:
    """A worker's share of tasks, ready to travel."""

    indices: list[int]
    ids: list[str]
    blob: bytes  # cloudpickle of the tasks
    settings: BatchSettings
    # The driver's import path: on the same machine, modules the driver can
    # import (a notebook's folder, a test directory) are importable by workers.
    sys_path: list[str]


def pack(items: Sequence[tuple[int, Task]], settings: BatchSettings) -> tuple[Batch, Pairs]:
    """Pickle a share; tasks that cannot be pickled come back as ``error`` results."""
    failed: Pairs = []
    try:
        blob = cloudpickle.dumps([task for _, task in items])
    except Exception:
        sendable = []
        for index, task in items:
            try:
                cloudpickle.dumps(task)
            except Exception as exc:
                failed.append((index, _unsendable(task, exc)))
            else:
                sendable.append((index, task))
        items = sendable
        blob = cloudpickle.dumps([task for _, task in items])
    batch = Batch(
        indices=[index for index, _ in items],
        ids=[task.id for _, task in items],
        blob=blob,
        settings=settings,
        sys_path=list(sys.path),
    )
    return batch, failed


def _unsendable(task: Task, exc: Exception) -> TaskResult:
    message = f"the task cannot be pickled to send it to a worker: {exc}"
    return failed_result(task.id, type(exc).__name__, message, time.time())


def run_packed(batch: Batch, emit: Callable[[bytes], None]) -> None:
    """Run a batch in this (worker) process; ``emit`` each encoded result as it finishes."""
    for path in batch.sys_path:
        if path not in sys.path:
            sys.path.append(path)
    try:
        tasks: list[Task] = cloudpickle.loads(batch.blob)
    except Exception as exc:
        message = f"the worker could not unpickle its tasks: {type(exc).__name__}: {exc}"
        now = time.time()
        failed = [
            (index, failed_result(task_id, "WorkerError", message, now))
            for index, task_id in zip(batch.indices, batch.ids, strict=True)
        ]
        emit(encode_results(failed))
        return

    def on_result(index: int, result: TaskResult) -> None:
        emit(encode_results([(index, result)]))

    items = list(zip(batch.indices, tasks, strict=True))
    run_coroutine(run_batch(items, batch.settings, on_result))


def encode_results(pairs: Pairs) -> bytes:
    """Pickle results, each on its own, beside its index and task id.

    A value that cannot be pickled turns its result into an error here; one
    that cannot be unpickled on the other side does so in ``decode_results``.
    """
    return bytes(
        cloudpickle.dumps([(index, result.task_id, _dumps(result)) for index, result in pairs])
    )


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


def decode_results(data: bytes) -> Pairs:
    pairs: Pairs = []
    for index, task_id, blob in cloudpickle.loads(data):
        try:
            result: TaskResult = cloudpickle.loads(blob)
        except Exception as exc:
            message = (
                f"the worker's result could not be unpickled here "
                f"(is the agent's return type importable?): {type(exc).__name__}: {exc}"
            )
            result = failed_result(task_id, "ResultUnpicklingError", message, time.time())
        pairs.append((index, result))
    return pairs
