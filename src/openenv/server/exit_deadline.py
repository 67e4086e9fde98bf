"""The last resort of a shutdown: end the process once it overruns its deadline.

A drain keeps ``shutdown_timeout`` on the event loop; when that loop is
blocked for good only a thread can still act. Armed only where openenv owns
the process's shutdown: a signal ``GracefulServer`` took in the main thread,
or a ``--workers`` worker whose supervisor is gone.
"""

from __future__ import annotations

import logging
import os
import threading

from openenv.server.config import ServerSettings
from openenv.server.service import LIVE_SERVICES
from openenv.server.slots import remove_if_unused

__all__ = [
    "EXIT_GRACE",
    "SHUTDOWN_TIMEOUT",
    "exit_deadline",
    "longest_shutdown",
    "orphan_board",
    "remove_orphaned_board",
]

logger = logging.getLogger("openenv.server")

EXIT_GRACE = 10.0  # past shutdown_timeout: for aborts, lifespan and closes to finish
# For apps the supervisor has not seen: ServerSettings' own default.
SHUTDOWN_TIMEOUT: float = ServerSettings.model_fields["shutdown_timeout"].default

# Set in a worker whose supervisor is gone: the board it must not leave behind.
_orphaned_board: str | None = None


def orphan_board(board: str | None) -> None:
    """Remember the slot board a worker's vanished supervisor left, to remove it on exit."""
    global _orphaned_board
    _orphaned_board = board


def remove_orphaned_board() -> None:
    if _orphaned_board is not None and remove_if_unused(_orphaned_board):
        logger.info("removed the slot board %s its supervisor left", _orphaned_board)


def exit_deadline() -> threading.Timer:
    """End the process if a shutdown overruns ``shutdown_timeout`` by ``EXIT_GRACE``.

    The drain keeps that deadline on the event loop, so an ``async def`` step
    that blocks the loop for good would hold the process (and under
    ``--workers`` its supervisor) for ever: only a thread can still act.
    """
    seconds = longest_shutdown() + EXIT_GRACE

    def expire() -> None:
        logger.error(
            "the shutdown overran its %gs deadline: the event loop is blocked (see the "
            "watchdog's warning) or a task would not end; exiting without it",
            seconds,
        )
        remove_orphaned_board()
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def longest_shutdown() -> float:
    """The longest ``shutdown_timeout`` of the apps this process serves."""
    return max((s.settings.shutdown_timeout for s in LIVE_SERVICES), default=SHUTDOWN_TIMEOUT)
