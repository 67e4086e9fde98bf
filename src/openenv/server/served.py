"""The connections a service serves, and what it does to all of them at once.

Two sweeps while it serves (a reply stalled on its client, sessions idle past
``session_timeout``) and, at shutdown, the drain that ends every session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from openenv.server.config import ServerSettings
    from openenv.server.slots import SessionRegistry

__all__ = ["Served", "ServedConnections"]

logger = logging.getLogger("openenv.server")

# After a shutdown's deadline aborts the sessions left, how long their tasks
# get to unwind (free slots, close idle environments) before the next try.
_ABORT_GRACE = 1.0


class Served(Protocol):
    """What the service asks of a connection it serves (v1's one session, v2's many)."""

    closed: asyncio.Future[None]  # done once every session of it is closed

    @property
    def sends(self) -> int:
        """Counts each send's start and its end: odd while a send waits on the
        peer, and the same odd number at two sweeps means the same send waits."""

    async def expire(self, reason: str) -> None:
        """End every session (a shutdown): close frames, environments closed."""

    def abort(self) -> None:
        """Drop the connection now; its task frees the slots."""

    def stall(self) -> None:
        """A send has waited past ``send_timeout``: abort the connection."""

    def idle_closings(self, deadline: float) -> list[Coroutine[Any, Any, None]]:
        """Closings of the sessions idle since before ``deadline`` (``time.monotonic``)."""

    def describe(self, task: asyncio.Task[Any]) -> str | None:
        """Which session ``task`` serves, if it is one of this connection's."""


class ServedConnections:
    """The sweeps and the drain of ``EnvService``'s connections."""

    connections: set[Served]
    settings: ServerSettings
    registry: SessionRegistry
    drain_hooks: list[Callable[[], Awaitable[None]]]
    _serving: dict[asyncio.AbstractEventLoop, bool]
    _background: set[asyncio.Task[None]]

    async def drain(self) -> None:
        """Refuse new sessions and steps, end every open one (close code 1001), close
        their environments.

        Bounded by ``shutdown_timeout``: steps that have not started never do;
        past the deadline every connection left is aborted and its slot freed, and
        an environment stuck in a blocking call is left behind (and logged)
        without ``close()`` rather than holding the shutdown.
        """
        loop = asyncio.get_running_loop()
        if loop in self._serving:
            self._serving[loop] = True
            self.registry.turn_away(loop)  # those in line are refused now, not at their timeout
        await asyncio.gather(self._drain_connections(loop), *(h() for h in self.drain_hooks))

    async def _drain_connections(self, loop: asyncio.AbstractEventLoop) -> None:
        connections = self._served_here(loop)
        if not connections:
            return
        expiring = [asyncio.ensure_future(c.expire("shutdown")) for c in connections]
        closed = [c.closed for c in connections]
        timeout = self.settings.shutdown_timeout
        _, pending = await asyncio.wait([*expiring, *closed], timeout=timeout)
        for task in expiring:
            task.cancel()
        if not pending:
            return
        left = [c for c in connections if not c.closed.done()]
        logger.error("%d session(s) still open after %ss; aborting them", len(left), timeout)
        for _ in range(3):  # a task may await again as it unwinds: cancel it again
            for connection in left:
                connection.abort()
            await asyncio.wait([c.closed for c in left], timeout=_ABORT_GRACE)
            left = [c for c in left if not c.closed.done()]
            if not left:
                return
        logger.error("%d session(s) would not end; shutting down without them", len(left))

    async def _abort_stalled_sends(self, limit: float) -> None:
        """Stall every connection whose reply has waited on its client past ``limit``.

        One sweep for all connections, rather than a timer around every reply;
        a connection counts its sends (``Served.sends``) instead of reading a
        clock for each. So a send is timed from the first sweep that saw it:
        stalled after ``limit`` to ``limit + interval``.
        """
        interval = min(max(limit / 4, 0.05), 1.0)
        loop = asyncio.get_running_loop()
        waiting: dict[Served, tuple[int, float]] = {}  # a send in progress, first seen
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            still: dict[Served, tuple[int, float]] = {}
            for connection in self._served_here(loop):
                sends = connection.sends
                if not sends & 1:
                    continue
                seen = waiting.get(connection)
                since = seen[1] if seen is not None and seen[0] == sends else now
                if now - since >= limit:
                    connection.stall()
                else:
                    still[connection] = (sends, since)
            waiting = still

    async def _reap_idle(self, idle_limit: float) -> None:
        interval = self.settings.reap_interval or min(max(idle_limit / 4, 0.01), 5.0)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            deadline = time.monotonic() - idle_limit
            for connection in self._served_here(loop):
                # Each on its own: a client that does not read its close frame
                # (bounded by send_timeout) must not hold up the next sweep.
                for closing in connection.idle_closings(deadline):
                    self._spawn(closing)

    def _served_here(self, loop: asyncio.AbstractEventLoop) -> list[Served]:
        """The connections of the server running ``loop`` (usually all of them)."""
        return [c for c in self.connections if c.closed.get_loop() is loop]

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(_discard_logged(self._background))


def _discard_logged(tasks: set[asyncio.Task[None]]) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("closing a session failed", exc_info=exc)

    return done
