"""The driver and a worker, talking over a byte stream: both ends of it.

A local worker process talks over its stdin and stdout; a Spark partition
over a TCP connection back to the driver. Either way every message is one
frame, a 4-byte big-endian length and then that many bytes of a pickled
tuple:

- driver to worker: ``("begin", settings, sys_path)`` starts a run,
  ``("play", parcel)`` hands over one task, ``("rest",)`` says nothing more
  is coming for now (the worker closes its idle sessions), ``("end",)``
  ends the run;
- worker to driver: ``("started", index)`` as the episode of a task with a
  timeout starts its clock (the driver's watch over the worker counts from
  then), ``("result", index, data)`` the moment an episode is over,
  ``("ended",)`` once a run's sessions are closed.

``ChannelWorker`` is the driver's end (what ``dispatch.serve`` drives);
``work`` is the worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import pickle
import secrets
import struct
from collections.abc import Callable
from typing import Any

import cloudpickle

from openenv.runtime.base import BatchSettings
from openenv.runtime.dispatch import WorkerLost
from openenv.runtime.shipping import EpisodeWorker, Parcel

__all__ = [
    "FRAME_HEADER",
    "CalledBackWorker",
    "ChannelWorker",
    "Switchboard",
    "call_back",
    "called_in",
    "frame",
    "keep_from_forks",
    "read_frame",
    "work",
]

FRAME_HEADER = struct.Struct(">I")
_TOKEN_BYTES = 16
# How long a remote worker's lost connection waits for the engine to say why.
_ENGINE_REASON_WAIT = 10.0

# The fds of this process's channel to the driver.
_channel_fds: set[int] = set()


def keep_from_forks(fd: int, *, keep: bool = True) -> None:
    """Point ``fd`` at /dev/null in every child this process forks (``keep=False``: stop).

    A child an agent forks (a multiprocessing helper) gets a copy of every fd,
    inheritable or not. Its copy of the channel would keep the stream open
    after this worker dies, for as long as the child lives: the driver would
    wait for the worker's results all that time. A fork from C skips this.
    """
    if keep:
        _channel_fds.add(fd)
    else:
        _channel_fds.discard(fd)


def _let_go_in_child() -> None:
    if not _channel_fds:
        return  # not a worker (the driver, a server): nothing to let go of
    null = os.open(os.devnull, os.O_RDWR)
    for fd in _channel_fds:
        os.dup2(null, fd, inheritable=False)
    os.close(null)
    _channel_fds.clear()


os.register_at_fork(after_in_child=_let_go_in_child)


def frame(message: tuple[Any, ...]) -> bytes:
    """One message, framed."""
    data: bytes = cloudpickle.dumps(message)
    return FRAME_HEADER.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    """The next message; ``asyncio.IncompleteReadError`` when the stream ends."""
    (size,) = FRAME_HEADER.unpack(await reader.readexactly(FRAME_HEADER.size))
    message: tuple[Any, ...] = pickle.loads(await reader.readexactly(size))
    return message


class ChannelWorker:
    """The driver's end of one worker's stream; subclasses say how to write, end and kill it."""

    what = "the worker"

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.died = asyncio.Event()
        self._stream = reader
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._started: dict[int, Callable[[], None]] = {}
        self._ended: asyncio.Future[None] | None = None
        self._reader = asyncio.create_task(self._read())

    # -- what a subclass provides --------------------------------------------

    def _write(self, data: bytes) -> None:
        """Send bytes; raise ``ConnectionError`` if the stream is closed."""
        raise NotImplementedError

    async def _gone(self) -> str:
        """The stream ended: wait for the worker to be gone; why it went."""
        raise NotImplementedError

    def abort(self) -> None:
        """Stop the worker now (never raises)."""
        raise NotImplementedError

    def _kept(self) -> None:
        """The run ended cleanly: keep the worker for the next one, if it can be."""

    # -- what dispatch.serve calls --------------------------------------------

    def begin(self, settings: BatchSettings, sys_path: list[str]) -> None:
        self._write(frame(("begin", settings, sys_path)))

    async def play(self, parcel: Parcel, started: Callable[[], None]) -> bytes:
        if self.died.is_set():
            raise WorkerLost(f"{self.what} is gone", sent=False)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[parcel.index] = future
        self._started[parcel.index] = started
        try:
            self._write(frame(("play", parcel)))
        except (ConnectionError, RuntimeError) as exc:
            raise WorkerLost(f"{self.what} is gone: {exc}", sent=False) from exc
        else:
            return await future
        finally:
            self._pending.pop(parcel.index, None)
            self._started.pop(parcel.index, None)

    async def finish(self) -> None:
        self._ended = asyncio.get_running_loop().create_future()
        try:
            self._write(frame(("end",)))
            await asyncio.wait_for(asyncio.shield(self._ended), 30)
        except Exception:  # it could not close its sessions: let it go
            self.abort()
            return
        self._kept()

    def rest(self) -> None:
        with contextlib.suppress(Exception):
            self._write(frame(("rest",)))

    async def _read(self) -> None:
        try:
            while True:
                message = await read_frame(self._stream)
                if message[0] == "result":
                    future = self._pending.get(message[1])
                    if future is not None and not future.done():
                        future.set_result(message[2])
                elif message[0] == "started":
                    started = self._started.pop(message[1], None)
                    if started is not None:
                        started()
                elif message[0] == "ended" and self._ended is not None and not self._ended.done():
                    self._ended.set_result(None)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker is gone
        finally:
            reason = await self._gone()
            self.died.set()
            lost = WorkerLost(reason, sent=True)
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(lost)
            if self._ended is not None and not self._ended.done():
                self._ended.set_exception(lost)


class CalledBackWorker(ChannelWorker):
    """A remote worker (a Ray actor, a Spark task) on the connection it opened back to us.

    ``outcome`` settles, with the reason, when the remote call that runs the
    worker ends; ``_stop`` ends that call from here.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        outcome: asyncio.Future[str],
    ) -> None:
        self.writer = writer
        self.outcome = outcome
        super().__init__(reader)

    def _stop(self) -> None:
        """End the remote call (never raises)."""
        raise NotImplementedError

    def _write(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise ConnectionResetError(f"the connection to {self.what} is closed")
        self.writer.write(data)

    def abort(self) -> None:
        self.writer.close()
        self._stop()

    async def _gone(self) -> str:
        self.writer.close()
        try:
            # A remote call fails a moment after its worker dies: wait for the engine's
            # reason. Not for long: Ray reports no death while a child the worker
            # forked lives on (it holds Ray's sockets too), and the lost episodes wait.
            return await asyncio.wait_for(asyncio.shield(self.outcome), _ENGINE_REASON_WAIT)
        except TimeoutError:
            self._stop()
            return f"the connection to {self.what} was lost"


async def work(
    reader: asyncio.StreamReader, emit: Callable[[bytes], None], *, once: bool = False
) -> None:
    """The worker's end: play every parcel as it arrives, on this loop, until the stream ends.

    ``once``: return after the first run's ``end`` (a Spark partition serves one run).
    """
    worker = EpisodeWorker()
    running: set[asyncio.Task[None]] = set()

    async def play(parcel: Parcel) -> None:
        def started() -> None:
            emit(frame(("started", parcel.index)))

        emit(frame(("result", parcel.index, await worker.play(parcel, started))))

    try:
        while True:
            try:
                message = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if message[0] == "begin":
                worker.begin(message[1], message[2])
            elif message[0] == "play":
                task = asyncio.create_task(play(message[1]))
                running.add(task)
                task.add_done_callback(running.discard)
            elif message[0] == "rest" and not running:
                await worker.end()  # its idle sessions hold server slots others may wait for
            elif message[0] == "end":
                await asyncio.gather(*running)
                await worker.end()
                emit(frame(("ended",)))
                if once:
                    return
    finally:
        for task in running:
            task.cancel()
        if running:
            # Their sessions go back to the run's pool as they stop: let them,
            # so that end() closes those sessions too.
            await asyncio.wait(running)
        await worker.end()


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Switchboard:
    """The driver's listening socket for one run, where its remote workers call in.

    A Spark task or a Ray actor is handed the address, the run's random token
    and its own number; it connects, sends the token and the number, and from
    then on the connection is that worker's channel. Nothing from a
    connection is unpickled before its token is checked.
    """

    def __init__(self, host: str) -> None:
        self.host = host
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self.address: tuple[str, int] = (host, 0)
        self._expected: dict[int, asyncio.Future[Streams]] = {}
        self._server: asyncio.Server | None = None
        self._answering: set[asyncio.StreamWriter] = set()  # connected, hello not yet read

    async def __aenter__(self) -> Switchboard:
        self._server = await asyncio.start_server(self._answer, self.host, 0)
        self.address = (self.host, self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for future in self._expected.values():
            _abandon(future)
        # A worker that called in as the run ended (a replacement called off):
        # the server's close leaves accepted connections open (Python < 3.13).
        for writer in self._answering:
            writer.close()

    def expect(self, number: int) -> asyncio.Future[Streams]:
        """The connection of worker ``number``, when it calls in."""
        future: asyncio.Future[Streams] = asyncio.get_running_loop().create_future()
        self._expected[number] = future
        return future

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._answering.add(writer)
        try:
            hello = await asyncio.wait_for(reader.readexactly(_TOKEN_BYTES + 8), 30)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        finally:
            self._answering.discard(writer)
        # Nothing from the connection is unpickled before its token is checked.
        token, number = hello[:_TOKEN_BYTES], int.from_bytes(hello[_TOKEN_BYTES:], "big")
        future = (
            self._expected.pop(number, None) if hmac.compare_digest(token, self.token) else None
        )
        if future is None or future.done():
            writer.close()
            return
        future.set_result((reader, writer))


async def called_in(
    accepted: asyncio.Future[Streams],
    outcome: asyncio.Future[str],
    call_off: Callable[[], None],
) -> Streams:
    """The connection of a worker being started (``Switchboard.expect``), or a
    ``RuntimeError`` with ``outcome``'s reason if its job ended first.

    Cancelled (the run ended first, or the start overran ``start_timeout``),
    it hangs up a connection that came meanwhile and calls ``call_off`` to
    give back what the start held (a pending Ray actor, a queued Spark job).
    """
    try:
        waits: set[asyncio.Future[Any]] = {accepted, outcome}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        _abandon(accepted)
        call_off()
        raise
    if not accepted.done():
        accepted.cancel()
        raise RuntimeError(outcome.result())
    return accepted.result()


def _abandon(accepted: asyncio.Future[Streams]) -> None:
    """A worker's connection no one will use: closed if it came, else not waited for."""
    if accepted.done() and not accepted.cancelled() and accepted.exception() is None:
        accepted.result()[1].close()
    accepted.cancel()


async def call_back(host: str, port: int, token: bytes, number: int) -> None:
    """The remote worker's end: call the driver back, then ``work`` until the run ends."""
    reader, writer = await asyncio.open_connection(host, port)
    fd = writer.get_extra_info("socket").fileno()
    keep_from_forks(fd)
    writer.write(token + number.to_bytes(8, "big"))
    try:
        await work(reader, writer.write, once=True)
    finally:
        keep_from_forks(fd, keep=False)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
