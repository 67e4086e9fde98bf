"""``LocalRuntime``: this process's event loop, or ``worker_num`` worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
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

    def __init__(self, transport: asyncio.SubprocessTransport, pipes: _Pipes) -> None:
        self.transport = transport
        self.pipes = pipes
        super().__init__(pipes.stdout)

    @classmethod
    async def spawn(cls) -> _Process:
        # The worker imports what this process can: openenv itself may come from
        # a path added at run time rather than from an installed package.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        transport, pipes = await asyncio.get_running_loop().subprocess_exec(
            _Pipes,
            sys.executable,
            "-m",
            "openenv.runtime.worker",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            env=env,
        )
        return cls(transport, pipes)

    def _write(self, data: bytes) -> None:
        stdin = self.transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        if stdin.is_closing():
            raise BrokenPipeError("the worker's stdin is closed")
        stdin.write(data)

    def _kept(self) -> None:
        _idle.append(self)

    def abort(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.transport.kill()

    async def _gone(self) -> str:
        # Not kill() at once: on a process that already exited, it reaps it
        # (Popen.poll) before asyncio's child watcher can read its exit code.
        try:
            await asyncio.wait_for(asyncio.shield(self.pipes.exited), 5)
        except TimeoutError:
            self.abort()
            await self.pipes.exited
        code = self.transport.get_returncode()
        self.transport.close()  # its stdin, which a child it forked may still hold open
        with contextlib.suppress(ValueError):
            _idle.remove(self)
        return f"the worker process exited with code {code}"


class _Pipes(asyncio.SubprocessProtocol):
    """A worker process's stdout as a stream that ends when the process does.

    A child the worker forked (an agent's multiprocessing helper, or a C
    library's fork) holds a copy of the pipe's writing end, and may outlive
    the worker: the pipe would not end until that child exits, and the
    worker's death would go unnoticed all that time. So once the process has
    exited, what it wrote is read at once and the stream ended here.
    """

    def __init__(self) -> None:
        self.stdout = asyncio.StreamReader()
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._transport: asyncio.SubprocessTransport | None = None
        self._ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._transport = transport
        stdout = transport.get_pipe_transport(1)
        assert stdout is not None
        self.stdout.set_transport(stdout)  # it pauses the pipe while its buffer is full

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.stdout.feed_data(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd != 1 or self._ended:
            return
        if exc is None:
            self.stdout.feed_eof()
        else:
            self.stdout.set_exception(exc)

    def process_exited(self) -> None:
        self.exited.set_result(None)
        assert self._transport is not None
        stdout = self._transport.get_pipe_transport(1)
        if stdout is None or stdout.is_closing():
            return
        # All the process wrote is in the pipe by now, or already read from it
        # and on its way here: each read is handed on with call_soon, so ours
        # goes after them. Once closed, the pipe's transport reads no more.
        fd = stdout.get_extra_info("pipe").fileno()
        rest = bytearray()
        with contextlib.suppress(BlockingIOError):  # all there is, without waiting
            while data := os.read(fd, 1 << 16):
                rest += data
        asyncio.get_running_loop().call_soon(self._end, bytes(rest))
        stdout.close()

    def _end(self, rest: bytes) -> None:
        self._ended = True
        self.stdout.feed_data(rest)
        self.stdout.feed_eof()


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
