"""uvicorn's WebSocket protocol with flow control both ways, the base of ``wsprotocol``.

- reading pauses when more than ``ws_max_queue`` messages wait for the app
  (uvicorn's pauses after each one), and resumes once half of them are read;
- reading also pauses while the write buffer is over its high-water mark: a
  peer that does not read may still send, and every ping it sends adds a pong
  to that buffer (uvicorn's protocol, and websockets' own server, read on and
  buffer pongs at the peer's sending rate, without bound); ``wsprotocol``
  pauses it, too, from the first byte after an upgrade request it took until
  the app's accept;
- send deadline: a peer that stops reading, so that the transport's buffer
  stays over its high-water mark for ``send_timeout`` seconds (30 unless
  the app sets it on the channel), is aborted: ``transport.abort()`` drops
  the buffer at once, where uvicorn's ``close()`` (its ping timeout, its
  shutdown) would wait for a drain that never comes; the app hears a
  disconnect and frees the session's slot.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.utils import get_client_addr
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from openenv.server.wsqueues import Flag, Inbox

__all__ = ["DEFAULT_SEND_TIMEOUT", "FlowControlled"]

# Seconds a peer may leave the write buffer full before it is aborted.
DEFAULT_SEND_TIMEOUT = 30.0

logger = logging.getLogger("openenv.server")


class FlowControlled(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol, reading only what it can answer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox(self.loop)  # type: ignore[assignment]
        self.writable = Flag(self.loop)  # type: ignore[assignment]
        self._max_queue = max(1, self.config.ws_max_queue)
        self._send_timeout: float | None = DEFAULT_SEND_TIMEOUT
        self._stall_timer: asyncio.TimerHandle | None = None

    def receive_nowait(self) -> Any:
        inbox: Inbox = self.queue  # type: ignore[assignment]
        message = inbox.pop()
        if self.read_paused and inbox.qsize() <= self._max_queue // 2 and self.writable.is_set():
            self.read_paused = False
            self.transport.resume_reading()
        return message

    def send_receive_event_to_app(self) -> None:
        # A message websockets read (a compressed frame, a fragmented one): uvicorn
        # pauses reading after each, until the app takes it. Only past the limit
        # here, as for the others: else a client that sent one while in line for
        # a slot, and then left, was not seen to leave until the app read.
        paused = self.read_paused
        super().send_receive_event_to_app()
        if not paused and self.read_paused and self.queue.qsize() <= self._max_queue:
            self.read_paused = False
            self.transport.resume_reading()

    async def receive(self) -> Any:
        while (message := self.receive_nowait()) is None:
            await self.arrival()
        return message

    def arrival(self) -> asyncio.Future[None]:
        inbox: Inbox = self.queue  # type: ignore[assignment]
        return inbox.arrival()

    # -- the write side -----------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm_stall_timer()
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self._resume_reading()

    def _resume_reading(self) -> None:
        """Read on if paused and neither the app's queue nor the write buffer is full."""
        if (
            self.read_paused
            and self.queue.qsize() <= self._max_queue // 2
            and self.writable.is_set()
        ):
            self.read_paused = False
            self.transport.resume_reading()

    def set_send_timeout(self, seconds: float | None) -> None:
        self._send_timeout = seconds
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if not self.writable.is_set():
            self._arm_stall_timer()

    def abort(self) -> None:
        if not self.disconnected:
            self.transport.abort()

    def _arm_stall_timer(self) -> None:
        if self._send_timeout is not None and self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self._send_timeout, self._stalled)

    def _stalled(self) -> None:
        self._stall_timer = None
        if self.disconnected or self.writable.is_set():
            return
        logger.warning(
            "client %s read nothing for %gs with %d bytes unsent; aborting its connection",
            get_client_addr(self.scope) if getattr(self, "scope", None) else "?",
            self._send_timeout,
            self.transport.get_write_buffer_size(),
        )
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        super().connection_lost(exc)
