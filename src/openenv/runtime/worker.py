"""A local worker process: ``python -m openenv.runtime.worker``, started by ``LocalRuntime``.

It talks to the driver over its stdin and stdout, one frame per message (see
``openenv.runtime.channel``), and plays every task it is handed as it
arrives, on one event loop. Whatever the agents (or programs they start)
print goes to stderr, and what they read from stdin is /dev/null, so they
can neither corrupt that stream nor take the driver's messages. It exits
when the driver's end of stdin closes (the driver is gone), without waiting
for agents' threads.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import BinaryIO

from openenv.runtime.channel import keep_from_forks, work
from openenv.runtime.episode import run_coroutine

__all__ = ["main"]


def main() -> None:
    # The channel gets fds of its own (not inherited by agents' child
    # processes); fd 1 becomes stderr and fd 0 /dev/null, so neither the
    # agents nor the programs they start can write into the channel or read
    # (steal) the driver's messages from it.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    commands = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, sys.stdin.fileno())
    os.close(null)
    for fd in (channel.fileno(), commands.fileno()):
        keep_from_forks(fd)  # the driver watches for the exit too: a fork from C skips this
    try:
        run_coroutine(_serve(commands, channel))
    finally:
        channel.flush()
        sys.stderr.flush()
        # A sync act() still blocking past its timeout keeps a thread: do not wait for it.
        os._exit(0)


async def _serve(commands: BinaryIO, channel: BinaryIO) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), commands)

    def emit(data: bytes) -> None:
        channel.write(data)
        channel.flush()

    await work(reader, emit)


if __name__ == "__main__":
    main()
