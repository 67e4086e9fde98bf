"""``RayRuntime``: shares of episodes as Ray tasks, results streamed back as they finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import ray

from openenv.runtime.base import (
    BatchSettings,
    ResultCallback,
    RuntimeEngine,
    collect,
    failed_result,
    finish,
    split,
)
from openenv.runtime.config import RunConfig
from openenv.runtime.shipping import Batch, decode_results, pack, run_packed
from openenv.runtime.task import Task, TaskResult

__all__ = ["RayRuntime", "connect"]


class RayRuntime(RuntimeEngine):
    """Runs tasks as ``worker_num`` Ray tasks, each playing its share on one event loop.

    Ray is used as found: an already initialised Ray, else a new local
    cluster when ``in_local``, else the cluster at ``RAY_ADDRESS`` (or
    whatever ``ray.init()`` finds or starts). Each Ray task is a streaming
    generator, so results arrive as episodes finish, and the driver awaits
    them without blocking its event loop. ``engine_options`` go to
    ``.options()`` (``num_cpus``, ``resources``, ``runtime_env``...). A
    sequence-dependent run is one Ray task playing the chain in order.
    """

    async def run(self, tasks: Sequence[Task], on_result: ResultCallback) -> list[TaskResult]:
        connect(self.config)
        settings = BatchSettings.from_config(self.config)
        results, record = collect(tasks, on_result)
        items = list(enumerate(tasks))
        shares = [items] if settings.sequence_dependent else split(items, self.config.worker_num)
        options = {"num_returns": "streaming", **self.config.engine_options}
        remote = _remote_share().options(**options)
        await asyncio.gather(*(_stream_share(remote, s, settings, record) for s in shares))
        return finish(results, tasks)


async def _stream_share(
    remote: Any, items: list[tuple[int, Task]], settings: BatchSettings, record: ResultCallback
) -> None:
    started = time.time()
    batch, unsendable = pack(items, settings)
    for index, result in unsendable:
        record(index, result)
    seen: set[int] = set()
    failure: Exception | None = None
    stream = remote.remote(batch)
    done = False
    try:
        async for ref in stream:
            for data in await ref:
                for index, result in decode_results(data):
                    seen.add(index)
                    record(index, result)
        done = True
    except Exception as exc:  # the Ray task failed or its worker died
        failure = exc
    finally:
        if not done and failure is None:  # cancelled: stop the remote work too
            with contextlib.suppress(Exception):
                ray.cancel(stream, force=True)
    kind = type(failure).__name__ if failure else "WorkerError"
    message = f"the Ray task ended before finishing this task: {failure or 'no result'}"
    for index, task_id in zip(batch.indices, batch.ids, strict=True):
        if index not in seen:
            record(index, failed_result(task_id, kind, message, started))


def connect(config: RunConfig) -> None:
    """Start or join Ray, unless this process already has."""
    if ray.is_initialized():
        return
    options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if config.in_local:
        ray.init(
            address="local",
            num_cpus=max(config.worker_num, os.cpu_count() or 1),
            object_store_memory=256 * 2**20,
            **options,
        )
    else:
        ray.init(address=os.environ.get("RAY_ADDRESS"), **options)


_remote: Any = None


def _remote_share() -> Any:
    global _remote
    if _remote is None:
        _remote = ray.remote(_play_share)
    return _remote


def _play_share(batch: Batch) -> Iterator[list[bytes]]:
    """The Ray task: run the batch on a thread's event loop, yield results as they come."""
    out: queue.SimpleQueue[bytes | BaseException | None] = queue.SimpleQueue()

    def work() -> None:
        try:
            run_packed(batch, out.put)
        except BaseException as exc:
            out.put(exc)
        finally:
            out.put(None)

    thread = threading.Thread(target=work, name="openenv-ray-share", daemon=True)
    thread.start()
    finished = False
    while not finished:
        item = out.get()
        chunk: list[bytes] = []
        while True:
            if item is None:
                finished = True
                break
            if isinstance(item, BaseException):
                raise item
            chunk.append(item)  # several ready results travel as one object
            try:
                item = out.get_nowait()
            except queue.Empty:
                break
        if chunk:
            yield chunk
    thread.join()
