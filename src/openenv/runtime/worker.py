"""A local worker process: ``python -m openenv.runtime.worker``, started by ``LocalRuntime``.

It talks to the driver over its stdin and stdout, one frame per message (see
``openenv.runtime.channel``), and plays every task it is handed as it
arrives, on one event loop. Whatever the agents print goes to stderr, so it
cannot corrupt that stream. It exits when stdin closes (the driver is gone),
without waiting for agents' threads.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import BinaryIO

from openenv.runtime.channel import work
from openenv.runtime.episode import run_coroutine

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

    def emit(data: bytes) -> None:
        channel.write(data)
        channel.flush()

    await work(reader, emit)


if __name__ == "__main__":
    main()
