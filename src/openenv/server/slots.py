"""Session slots: the cap of one server, shared by every worker process.

``SessionRegistry`` holds a server process's slots and its line of waiting
connections. On its own it caps one process.

Under ``openenv serve --workers N`` each worker's registry also counts its
slots on the shared ``SlotBoard`` (``server/slot_board.py``), so the cap holds
for the whole server.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

from openenv.server.slot_board import (
    BOARD_VAR,
    SlotBoard,
    add_numbers,
    forget_worker,
    remove_if_unused,
)

if TYPE_CHECKING:
    from openenv.server.sessions import Session

__all__ = [
    "BOARD_VAR",
    "SessionRegistry",
    "SlotBoard",
    "add_numbers",
    "forget_worker",
    "remove_if_unused",
]


class SessionRegistry:
    """The session slots of one server, and the queue of those waiting.

    ``try_acquire`` and ``release`` never await, so on one event loop the check
    and the increment cannot interleave: the cap holds without a lock. A freed
    slot goes straight to the longest-waiting connection, so nobody barges in.

    When the server runs several worker processes, each registry also counts
    its slots on a shared ``SlotBoard`` (``attach``), so ``max_sessions`` caps
    the whole server; a connection waiting in line here then also takes a slot
    freed by another worker, checked every ``poll_interval`` seconds.
    """

    poll_interval = 0.01

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self._reserved = 0
        self._waiters: collections.deque[asyncio.Future[bool]] = collections.deque()
        self._board: SlotBoard | None = None
        self._poller: asyncio.Task[None] | None = None

    @property
    def active(self) -> int:
        """Slots this process holds."""
        return self._reserved

    @property
    def queued(self) -> int:
        """Connections this process holds in line."""
        return len(self._waiters)

    def totals(self) -> tuple[int, int]:
        """Slots held and connections in line, across every worker of the server."""
        if self._board is None:
            return self._reserved, len(self._waiters)
        return self._board.totals()

    @property
    def board(self) -> SlotBoard | None:
        """The board shared with other workers, if any."""
        return self._board

    def workers(self) -> int:
        """Worker processes sharing the cap (1 without a board)."""
        return 1 if self._board is None else self._board.workers()

    def attach(self, board: SlotBoard) -> None:
        """Count slots on ``board`` from now on (before any session opens)."""
        assert self._reserved == 0, "attach a board before serving"
        assert not self._waiters, "attach a board before serving"
        self._board = board

    def detach(self) -> None:
        """Leave the board: the server has stopped."""
        if self._poller is not None:
            self._poller.cancel()
        if self._board is not None:
            self._board.leave()
            self._board = None

    def try_acquire(self) -> bool:
        """Reserve a slot before the factory runs; ``False`` when full."""
        if self._waiters:
            return False
        board = self._board
        if board is None:
            if self._reserved >= self.max_sessions:
                return False
        elif board.queued_elsewhere() or not board.take(self.max_sessions):
            return False
        self._reserved += 1
        return True

    async def acquire(self, wait: float) -> bool:
        """Reserve a slot, waiting up to ``wait`` seconds in line for one."""
        if self.try_acquire():
            return True
        if wait <= 0:
            return False
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._publish_queue()
        if self._board is not None and self._poller is None:
            self._poller = asyncio.create_task(self._poll(self._board))
        try:
            async with asyncio.timeout(wait):
                return await waiter  # False: turned away (``turn_away``)
        except TimeoutError:
            # The slot may have been handed over just as the deadline passed.
            return waiter.done() and not waiter.cancelled() and waiter.result()
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release()  # granted just as we were cancelled: pass it on
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            self._publish_queue()

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)  # the slot changes hands; the count stays
                return
        self._reserved -= 1
        assert self._reserved >= 0, "session slot released twice"
        if self._board is not None:
            self._board.give()

    def turn_away(self, loop: asyncio.AbstractEventLoop) -> None:
        """End the wait of every connection in line on ``loop``, with no slot (its
        server is shutting down: a slot freed now must not make an environment)."""
        for waiter in [w for w in self._waiters if w.get_loop() is loop and not w.done()]:
            waiter.set_result(False)

    def add(self, session: Session) -> None:
        self.sessions[session.id] = session

    def remove(self, session: Session) -> None:
        del self.sessions[session.id]
        self.release()

    def _publish_queue(self) -> None:
        if self._board is not None:
            self._board.set_queued(len(self._waiters))

    async def _poll(self, board: SlotBoard) -> None:
        """Hand slots freed by other workers to this worker's line, oldest first."""
        try:
            while self._waiters:
                await asyncio.sleep(self.poll_interval)
                while self._waiters and board.take(self.max_sessions):
                    waiter = self._waiters.popleft()
                    if waiter.done():  # gave up meanwhile
                        board.give()
                        continue
                    self._reserved += 1
                    waiter.set_result(True)
                self._publish_queue()
        finally:
            self._poller = None
