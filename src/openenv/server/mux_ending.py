"""How a v2 connection ends: a shutdown's notices, idle sessions' expiry, an
abort, a client that stopped reading, and every session closed exactly once.

``MuxConnection`` (``server/mux.py``) reads frames and serves its sessions;
this is its other half, kept apart so that each reads on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketState

from openenv import protocol_v2
from openenv.protocol import CloseCode
from openenv.protocol_v2 import SessionKey
from openenv.server.direct import DirectChannel
from openenv.server.mux_writer import GONE, Outbox
from openenv.server.service import EnvService
from openenv.server.session_host import OPEN

if TYPE_CHECKING:
    from openenv.server.mux import Lane

__all__ = ["ConnectionEnding"]

logger = logging.getLogger("openenv.server")

_GONE = GONE


class ConnectionEnding:
    """The ending of a ``MuxConnection``, whose state it shares."""

    websocket: WebSocket
    lanes: dict[SessionKey, Lane]
    outbox: Outbox
    _service: EnvService
    _channel: DirectChannel | None
    _gone: bool
    _ending: str | None
    _task: asyncio.Task[None] | None
    _tasks: set[asyncio.Task[None]]

    if TYPE_CHECKING:

        async def _close_lane(self, lane: Lane, reason: str) -> None: ...

        def _reply(self, key: SessionKey, frame: str) -> None: ...

    async def _end_all(self, reason: str) -> None:
        """Close every session of the connection, each exactly once."""
        self._gone = True
        lanes = list(self.lanes.values())
        for lane in lanes:
            # One the client is closing keeps its close() call.
            if lane.session is not None and lane.session.state is OPEN:
                lane.session.cancel_queued("the connection closed")
            lane.queue.clear()
        running = list(self._tasks)  # lanes serving requests, and sessions closing
        for lane in lanes:
            if not lane.admitted and lane.task is not None:
                lane.task.cancel()  # still waiting for a slot: admit() is safe to cancel
        if running:
            await asyncio.wait(running)
        for lane in lanes:
            await self._close_lane(lane, reason)
        self.lanes.clear()

    async def expire(self, reason: str) -> None:
        """End every session (a shutdown): a ``closed`` notice each, then close 1001."""
        if self._ending is not None:
            return
        self._ending = reason
        message = "server shutting down"
        for lane in list(self.lanes.values()):
            # A session the client is closing gets the reply to its close instead.
            if lane.session is not None and lane.session.state is OPEN:
                lane.session.cancel_queued(message)
                self._reply(
                    lane.key, protocol_v2.closed_frame(reason, CloseCode.GOING_AWAY, message)
                )
        with contextlib.suppress(*_GONE, TimeoutError):
            await self._flush_and_close(CloseCode.GOING_AWAY)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def idle_closings(self, deadline: float) -> list[Coroutine[Any, Any, None]]:
        return [
            self._expire_lane(lane)
            for lane in self.lanes.values()
            if lane.task is None
            and lane.session is not None
            and lane.session.state is OPEN
            and not lane.session.busy  # a step the fast path started
            and lane.session.last_active < deadline
        ]

    async def _expire_lane(self, lane: Lane) -> None:
        session = lane.session
        if (
            self.lanes.get(lane.key) is not lane
            or lane.task is not None
            or session is None
            or session.busy
        ):
            return  # it got work (or closed) since the sweep
        logger.info("session %s idle over its limit; closing", session.id)
        # The name is free once the notice is out, as after an error: what the
        # client sends for it after the notice must not wait on close().
        del self.lanes[lane.key]
        self._reply(
            lane.key,
            protocol_v2.closed_frame(
                "idle_timeout", CloseCode.GOING_AWAY, "session closed after being idle too long"
            ),
        )
        await session.aclose("idle_timeout")

    def describe(self, task: asyncio.Task[Any]) -> str | None:
        for lane in list(self.lanes.values()):
            session = lane.session
            if session is not None and task in (lane.task, session.step_task):
                return f"session {session.id}"
        return None

    def abort(self) -> None:
        """Drop the connection now; ``run``'s ``finally`` frees every slot."""
        for lane in list(self.lanes.values()):
            if lane.session is not None and lane.session.state is OPEN:
                lane.session.abandon()
        for task in list(self._tasks):  # lanes, and sessions that ended and are closing
            task.cancel()
        if self._channel is not None:
            self._channel.abort()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def stall(self) -> None:
        logger.warning(
            "a v2 client did not read its replies within %gs; aborting its connection",
            self._service.settings.send_timeout,
        )
        self._gone = True
        if self._channel is not None:
            self._channel.abort()
        self.outbox.abort()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _flush_and_close(self, code: CloseCode) -> None:
        if self.websocket.application_state is WebSocketState.DISCONNECTED:
            return
        await self.outbox.stop()  # one sender at a time: what it had not sent goes below
        try:
            await self.outbox.flush(self.websocket, self._service.settings.send_timeout)
            await self._close_socket(code)
        except (*_GONE, TimeoutError):
            pass

    async def _close_socket(self, code: CloseCode) -> None:
        with contextlib.suppress(*_GONE, TimeoutError):
            async with asyncio.timeout(self._service.settings.send_timeout):
                await self.websocket.close(code)
