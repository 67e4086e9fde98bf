"""A local worker process: ``python -m openenv.runtime.worker``, started by ``LocalRuntime``.

It reads one pickled ``Batch`` from stdin, runs it on its own event loop, and
writes each result to stdout as it finishes: a 4-byte big-endian length, then
that many bytes of pickled ``[(index, TaskResult)]``. Whatever the agents
print goes to stderr, so it cannot corrupt that stream.
"""

from __future__ import annotations

import os
import pickle
import sys

from openenv.runtime.shipping import FRAME_HEADER, Batch, run_packed

__all__ = ["main"]


def main() -> None:
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    batch: Batch = pickle.loads(sys.stdin.buffer.read())

    def emit(data: bytes) -> None:
        channel.write(FRAME_HEADER.pack(len(data)) + data)
        channel.flush()

    run_packed(batch, emit)
    channel.close()


if __name__ == "__main__":
    main()
