"""A local worker process: ``python -m openenv.runtime.worker``, started by ``LocalRuntime``.

It reads frames from stdin (a 4-byte big-endian length, then that many bytes
of a pickled message): ``("begin", settings, sys_path)`` starts a run,
``("play", parcel)`` hands it one task, ``("rest",)`` says nothing more
is coming for now (so it closes its idle sessions), ``("end",)`` ends the run. It plays
every parcel as it arrives, on one event loop, and writes each result to
stdout the moment it is in, framed the same way: ``("result", index,
data)``, and ``("ended",)`` once a run's sessions are closed. Whatever the
agents print goes to stderr, so it cannot corrupt that stream. It exits when
stdin closes (the driver is gone), without waiting for agents' threads.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, BinaryIO

import cloudpickle

from openenv.runtime.episode import run_coroutine
from openenv.runtime.shipping import FRAME_HEADER, EpisodeWorker, Parcel

__all__ = ["main"]


def main() -> None:
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        run_coroutine(_serve(channel))
    finally:
        channel.flush()
        sys.stderr.flush()
        # A sync act() still blocking past its timeout keeps a thread: do not wait for it.
        os._exit(0)


async def _serve(channel: BinaryIO) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    worker = EpisodeWorker()
    running: set[asyncio.Task[None]] = set()

    def emit(message: tuple[Any, ...]) -> None:
        data = cloudpickle.dumps(message)
        channel.write(FRAME_HEADER.pack(len(data)) + data)
        channel.flush()

    async def play(parcel: Parcel) -> None:
        emit(("result", parcel.index, await worker.play(parcel)))

    while True:
        try:
            (size,) = FRAME_HEADER.unpack(await reader.readexactly(FRAME_HEADER.size))
            message = cloudpickle.loads(await reader.readexactly(size))
        except asyncio.IncompleteReadError:
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
            emit(("ended",))
    for task in running:
        task.cancel()
    await worker.end()


if __name__ == "__main__":
    main()
