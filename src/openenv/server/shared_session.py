"""A session that HTTP requests and, one at a time, a v1 WebSocket both drive.

OpenEnv's own ``/mcp`` sessions (``server/openenv_mcp.py``) are made over
HTTP and call tools over HTTP, while ``/ws?session_id=<id>`` attaches a
WebSocket that resets and steps the same environment. Every other session
belongs to exactly one transport; this one differs in three ways:

- its requests never overlap: each ``handle`` (the WebSocket's frames, the
  HTTP tool calls) holds ``lock``, and the WebSocket's steps all go through
  ``handle`` (no direct steps from the protocol's callbacks), so the
  environment is never called from two threads at once;
- its WebSocket leaving (a disconnect, a ``close`` frame, a frame too big)
  only detaches it: the session stays, as on OpenEnv's server, until its
  client closes it over HTTP or it idles out; an error that ends the
  session, an idle timeout or a shutdown of the WebSocket still close it;
- a close waits for the request in flight (``lock``), and tells its owner
  (``on_closed``), which forgets it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from openenv import protocol
from openenv.environment import Environment
from openenv.protocol import ErrorCode
from openenv.server.session_host import SessionHost, SessionState
from openenv.server.sessions import Session

__all__ = ["SharedSession"]

# Why a WebSocket ends that leaves its session open (endpoint.Connection's reasons).
_LEFT = frozenset({"disconnect", "client_close", "message_too_big"})


class SharedSession(Session):
    """A ``Session`` that outlives its WebSockets, its requests taken one at a time."""

    def __init__(self, env: Environment[Any, Any, Any], service: SessionHost) -> None:
        super().__init__(env, service)
        self.direct_steps = False  # every frame through handle(), under the lock
        self.lock = asyncio.Lock()
        self.attached = False  # a WebSocket is attached now
        self.close_pending = False  # closed over HTTP while attached: ends when it leaves
        self.on_closed: Callable[[SharedSession, str], None] | None = None
        self._giving_up = False
        self.ending = False  # its close has begun: every request is answered at once

    def _ended(self, request: dict[str, Any] | None) -> str:
        request_id = request.get("id") if request is not None else None
        return protocol.error_frame(
            ErrorCode.SESSION_ERROR,
            f"the session has ended ({self._closing_because})",
            request_id=request_id if isinstance(request_id, str | int) else None,
        )

    async def handle(
        self, frame: str | bytes | None, request: dict[str, Any] | None = None
    ) -> str | None:
        if self.ending:  # not behind its close, which may wait for an overrunning call
            return self._ended(request)
        async with self.lock:
            if self.state is not SessionState.OPEN:  # it ended while this request waited
                return self._ended(request)
            reply = await super().handle(frame, request)
            if reply is None:  # a close frame ends the WebSocket (which detaches), not this
                self.state = SessionState.OPEN
            return reply

    def abandon(self) -> None:
        super().abandon()
        self._giving_up = True  # a shutdown's deadline: close without waiting for the lock

    async def aclose(self, reason: str) -> None:
        """Close, or for a WebSocket that left (``_LEFT``), only detach it."""
        if self.state is SessionState.OPEN and reason in _LEFT:
            self.attached = False
            self.last_active = time.monotonic()  # idle from now, not from its last frame
            if not self.close_pending:
                return
            reason = "client_close"  # over HTTP, while it was attached
        if self.state is SessionState.CLOSED:
            return
        self.ending = True
        self._closing_because = f"closed: {reason.removeprefix('openenv_mcp_').replace('_', ' ')}"
        try:
            if self._giving_up:
                await super().aclose(reason)
                return
            try:
                await self.lock.acquire()  # after the request in flight
            except asyncio.CancelledError:
                self.abandon()  # a shutdown past its deadline: free the slot at least
                await super().aclose(reason)
                raise
            try:
                await super().aclose(reason)
            finally:
                self.lock.release()
        finally:
            if self.on_closed is not None and self.closed:
                self.on_closed(self, reason)

    @property
    def closed(self) -> bool:
        """Whether the environment is closed and the slot free."""
        return self.state is SessionState.CLOSED
