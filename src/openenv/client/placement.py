"""Placing an ``EnvClient``'s session on a ``ServerPool``.

The server is chosen as the session opens: a server that cannot be reached
goes back to the pool and the next one is tried, and a first request turned
away (the server is full, or shutting down) goes to the next server the pool
chooses, since no session was made there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from openenv import protocol
from openenv.errors import AuthenticationError, ConnectionFailedError, SessionClosedError

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from openenv.client.pool import ServerPool

__all__ = ["PoolPlacement"]

# Servers a new session may fail to reach, or lose (gone before replying), before
# the error is the caller's.
_ATTEMPTS = 8


class PoolPlacement:
    """The pool side of ``EnvClient``: where its session opens, and moving on."""

    pool: ServerPool | None
    url: str
    _placed: bool
    _admitted: bool
    _ws: ClientConnection | None
    _owed: int

    if TYPE_CHECKING:

        async def _opened(self, url: str) -> ClientConnection: ...

        async def _exchange(self, kind: str, frame: str) -> str | bytes: ...

    async def _open_connection(self) -> None:
        self._owed = 0  # a new connection owes no reply
        if self.pool is None:
            self._ws = await self._opened(self.url)
            return
        failed = 0
        while True:
            self.url, self._placed = await self.pool.place(), True
            try:
                self._ws = await self._opened(self.url)
            except AuthenticationError:
                self._unplace(self.pool.failed)
                raise
            except ConnectionFailedError:
                self._unplace(self.pool.failed)  # the pool tries the next server
                # A server whose /health answers but whose /ws never does (a proxy
                # without WebSockets) is back in the pool at its next health check.
                failed += 1
                if failed >= _ATTEMPTS:
                    raise
            else:
                return

    def _unplace(self, outcome: Callable[[str], None]) -> None:
        if self._placed:
            self._placed = False
            outcome(self.url)

    async def _placed_request(self, kind: str, frame: str) -> str | bytes:
        if self._admitted:
            return await self._exchange(kind, frame)
        assert self.pool is not None
        # The first request on a pool's server: a refusal for capacity (or a
        # server gone before answering) means no session was made there, so
        # the same request goes to the next server the pool chooses.
        deadline = time.monotonic() + self.pool.wait
        lost = 0
        while True:
            try:
                reply = await self._exchange(kind, frame)
            except SessionClosedError:
                lost += 1
                if lost >= _ATTEMPTS:
                    raise
                outcome = self.pool.failed
            else:
                refusal = _refusal(reply)
                if refusal is None:
                    self._admitted = True
                    return reply
                if refusal == "draining":  # shutting down: as a server gone
                    lost += 1
                    if lost >= _ATTEMPTS:
                        return reply  # raises SessionError where it is decoded
                    outcome = self.pool.failed
                elif time.monotonic() > deadline:
                    return reply  # raises CapacityError where it is decoded
                else:
                    outcome = self.pool.refused
            self._unplace(outcome)
            ws, self._ws = self._ws, None
            if ws is not None:
                await ws.close()


def _refusal(reply: str | bytes) -> Literal["full", "draining"] | None:
    """Whether ``reply`` refused to open a session on its server, which a pool then
    places on another: the server is full, or is shutting down (``draining``)."""
    # A cheap look first: only a refusal names these, and it is rare.
    text = reply if isinstance(reply, bytes) else reply.encode()
    if b"CAPACITY_REACHED" not in text and b'"draining"' not in text:
        return None
    data = protocol.decode_frame(reply)
    error = (data.get("data") or {}) if data.get("type") == "error" else {}
    if error.get("code") == protocol.ErrorCode.CAPACITY_REACHED.value:
        return "full"
    return "draining" if error.get("draining") is True else None
