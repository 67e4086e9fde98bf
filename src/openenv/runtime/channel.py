"""The driver and a worker, talking over a byte stream: both ends of it.

A local worker process talks over its stdin and stdout; a Spark partition
over a TCP connection back to the driver. Either way every message is one
frame, a 4-byte big-endian length and then that many bytes of a pickled
tuple:

- driver to worker: ``("begin", settings, sys_path)`` starts a run,
  ``("play", parcel)`` hands over one task, ``("rest",)`` says nothing more
  is coming for now (the worker closes its idle sessions), ``("end",)``
  ends the run;
- worker to driver: ``("result", index, data)`` the moment an episode is
  over, ``("ended",)`` once a run's sessions are closed.

``ChannelWorker`` is the driver's end (what ``dispatch.serve`` drives);
``work`` is the worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import struct
from collections.abc import Callable
from typing import Any

import cloudpickle

from openenv.runtime.base import BatchSettings
from openenv.runtime.dispatch import WorkerLost
from openenv.runtime.shipping import EpisodeWorker, Parcel

__all__ = ["FRAME_HEADER", "ChannelWorker", "frame", "read_frame", "work"]

FRAME_HEADER = struct.Struct(">I")


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

    async def play(self, parcel: Parcel) -> bytes:
        if self.died.is_set():
            raise WorkerLost(f"{self.what} is gone", sent=False)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[parcel.index] = future
        try:
            self._write(frame(("play", parcel)))
        except (ConnectionError, RuntimeError) as exc:
            self._pending.pop(parcel.index, None)
            raise WorkerLost(f"{self.what} is gone: {exc}", sent=False) from exc
        try:
            return await future
        finally:
            self._pending.pop(parcel.index, None)

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


async def work(
    reader: asyncio.StreamReader, emit: Callable[[bytes], None], *, once: bool = False
) -> None:
    """The worker's end: play every parcel as it arrives, on this loop, until the stream ends.

    ``once``: return after the first run's ``end`` (a Spark partition serves one run).
    """
    worker = EpisodeWorker()
    running: set[asyncio.Task[None]] = set()

    async def play(parcel: Parcel) -> None:
        emit(frame(("result", parcel.index, await worker.play(parcel))))

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
        await worker.end()
