"""``LocalRuntime``: this process's event loop, or ``worker_num`` worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from openenv.runtime.base import BatchSettings, ResultCallback, RuntimeEngine, collect, finish
from openenv.runtime.channel import ChannelWorker
from openenv.runtime.dispatch import Dispatcher, serve
from openenv.runtime.episode import run_batch
from openenv.runtime.shipping import pack_tasks
from openenv.runtime.task import Task, TaskResult

__all__ = ["LocalRuntime", "in_background"]

_T = TypeVar("_T")


class LocalRuntime(RuntimeEngine):
    """Runs tasks on this machine.

    With ``worker_num == 1`` (or ``reuse_process=True``) every episode runs on
    the calling event loop, up to ``max_concurrency`` at once. Otherwise
    (or with ``reuse_process=False``) ``worker_num`` Python processes
    (``python -m openenv.runtime.worker``) play them, each with up to
    ``max_concurrency`` episodes in flight: a process is handed the next task
    whenever one of its episodes ends, and each result comes back as soon as
    it is in. A process that dies is replaced; the episodes it was playing go
    to another one (finished ones are never played again). The processes
    stay up for the next run in this program, so only the first run pays
    for their start.
    """

    async def run(self, tasks: Sequence[Task], on_result: ResultCallback) -> list[TaskResult]:
        settings = BatchSettings.from_config(self.config)
        results, record = collect(tasks, on_result)
        # One task still goes to a worker process when worker_num > 1: only
        # there does its timeout bind over an agent that blocks the event loop.
        in_process = self.config.reuse_process
        if in_process is None:
            in_process = self.config.worker_num == 1
        if in_process:
            await run_batch(list(enumerate(tasks)), settings, record)
            return finish(results, tasks)
        blobs = pack_tasks(tasks)  # an agent that cannot travel fails here, before any runs
        caller = asyncio.get_running_loop()

        def forward(index: int, result: TaskResult) -> None:
            caller.call_soon_threadsafe(record, index, result)

        workers = 1 if settings.sequence_dependent else min(self.config.worker_num, len(tasks))
        dispatcher_run = _run_on_processes(tasks, blobs, settings, forward, workers)
        await in_background(dispatcher_run)
        return finish(results, tasks)


async def _run_on_processes(
    tasks: Sequence[Task],
    blobs: list[bytes],
    settings: BatchSettings,
    on_result: ResultCallback,
    workers: int,
) -> None:
    dispatcher = Dispatcher(tasks, blobs, settings, on_result)
    sys_path = list(sys.path)

    async def start() -> _Process:
        process = _idle.pop() if _idle else await _Process.spawn()
        process.begin(settings, sys_path)
        return process

    await serve(dispatcher, start, workers, settings.max_concurrency)


# Worker processes between runs, kept warm; they live on the background loop.
_idle: list[_Process] = []


class _Process(ChannelWorker):
    """A worker process: parcels down its stdin, results up its stdout."""

    what = "the worker process"

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        self.proc = proc
        super().__init__(proc.stdout)

    @classmethod
    async def spawn(cls) -> _Process:
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
        return cls(proc)

    def _write(self, data: bytes) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        if stdin.is_closing():
            raise BrokenPipeError("the worker's stdin is closed")
        stdin.write(data)

    def _kept(self) -> None:
        _idle.append(self)

    def abort(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    async def _gone(self) -> str:
        # Not kill() at once: on a process that already exited, it reaps it
        # (Popen.poll) before asyncio's child watcher can read its exit code.
        try:
            code = await asyncio.wait_for(asyncio.shield(self.proc.wait()), 5)
        except TimeoutError:
            self.abort()
            code = await self.proc.wait()
        with contextlib.suppress(ValueError):
            _idle.remove(self)
        return f"the worker process exited with code {code}"


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A forked child inherits the loop without the thread that runs it (a run
    # put on it would wait for ever), and the parent's warm workers, whose
    # pipes the parent still reads: it starts its own of both when it runs.
    global _loop, _loop_lock
    _loop, _loop_lock = None, threading.Lock()
    _idle.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="openenv-processes", daemon=True
            )
            thread.start()
            _loop = loop
        return _loop


async def in_background(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on this program's one background loop, which owns the worker processes.

    Processes (their pipes) belong to the loop that started them; every run
    has a loop of its own (``sync_run_task`` makes one each time), so the
    warm processes live on a loop that outlives the runs.
    """
    future: Future[_T] = asyncio.run_coroutine_threadsafe(coro, _background_loop())
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        future.cancel()
        raise
