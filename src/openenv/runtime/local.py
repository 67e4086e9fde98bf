"""``LocalRuntime``: this process's event loop, or ``worker_num`` worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import sys
import time
from collections.abc import Sequence

from openenv.runtime.base import (
    BatchSettings,
    ResultCallback,
    RuntimeEngine,
    collect,
    failed_result,
    finish,
    split,
)
from openenv.runtime.episode import run_batch
from openenv.runtime.shipping import FRAME_HEADER, decode_results, pack
from openenv.runtime.task import Task, TaskResult

__all__ = ["LocalRuntime"]


class LocalRuntime(RuntimeEngine):
    """Runs tasks on this machine.

    With ``worker_num == 1`` (or ``sequence_dependent``) every episode runs on
    the calling event loop, up to ``max_concurrency`` at once. Otherwise the
    tasks are dealt among ``worker_num`` fresh Python processes
    (``python -m openenv.runtime.worker``), each running its share on its own
    loop with ``max_concurrency`` in flight, streaming results back as they
    finish. A worker that dies leaves ``error`` results for the tasks it had
    not finished; it never takes the others down with it.
    """

    async def run(self, tasks: Sequence[Task], on_result: ResultCallback) -> list[TaskResult]:
        settings = BatchSettings.from_config(self.config)
        results, record = collect(tasks, on_result)
        items = list(enumerate(tasks))
        if self.config.worker_num == 1 or settings.sequence_dependent or len(items) == 1:
            await run_batch(items, settings, record)
        else:
            shares = split(items, self.config.worker_num)
            await asyncio.gather(*(self._run_process(s, settings, record) for s in shares))
        return finish(results, tasks)

    async def _run_process(
        self, items: list[tuple[int, Task]], settings: BatchSettings, record: ResultCallback
    ) -> None:
        started = time.time()
        batch, unsendable = pack(items, settings)
        for index, result in unsendable:
            record(index, result)
        # The worker imports what this process can: openenv itself may come from
        # a path added at run time rather than from an installed package.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "openenv.runtime.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        assert proc.stdin is not None
        assert proc.stdout is not None
        seen: set[int] = set()
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(pickle.dumps(batch))
                await proc.stdin.drain()
                proc.stdin.close()
            await _read_frames(proc.stdout, record, seen)
            code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        message = f"the worker process exited with code {code} before finishing this task"
        for index, task_id in zip(batch.indices, batch.ids, strict=True):
            if index not in seen:
                record(index, failed_result(task_id, "WorkerError", message, started))


async def _read_frames(
    stream: asyncio.StreamReader, record: ResultCallback, seen: set[int]
) -> None:
    while True:
        try:
            header = await stream.readexactly(FRAME_HEADER.size)
            (size,) = FRAME_HEADER.unpack(header)
            data = await stream.readexactly(size)
        except asyncio.IncompleteReadError:
            return  # the worker is gone; its unfinished tasks are reported by the caller
        for index, result in decode_results(data):
            seen.add(index)
            record(index, result)
