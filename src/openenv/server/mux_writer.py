"""The sending half of a v2 connection: replies gathered into frames.

Replies go to an outbox; one task sends whatever the outbox holds as one frame
each time it wakes. So replies finished at the same moment (a batch of steps
back from the worker threads together) share a frame, and none waits for
another that is not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from starlette.types import Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from openenv import protocol_v2
from openenv.protocol_v2 import SessionKey
from openenv.server.direct import DirectChannel

__all__ = ["Outbox"]

# What a send to a socket whose peer is gone raises, depending on the ASGI server.
GONE = (WebSocketDisconnect, OSError, RuntimeError)


class Outbox:
    """Replies of one v2 connection, and the task that sends them."""

    def __init__(
        self,
        send: Send,
        channel: DirectChannel | None,
        on_gone: Callable[[], None],
        on_sent: Callable[[], None],
    ):
        self._send = send
        self._channel = channel
        self._on_gone = on_gone
        self._on_sent = on_sent
        # Tagged with their sessions, or about a whole frame; each item one reply,
        # or several encoded together (an array: ``protocol_v2.frame_of``).
        self._replies: list[str] = []
        # Replies queued and not yet handed to the socket: the reader counts them
        # as in flight, so a client that reads nothing stops being read.
        self.unsent = 0
        self._wake: asyncio.Future[None] | None = None  # the writer, waiting
        self._task: asyncio.Task[None] | None = None
        # Odd while a send waits on the peer (``Served.sends``; the service's sweep reads it).
        self.sends = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._write())

    def reply(self, key: SessionKey, frame: str) -> None:
        """Queue a v1 reply of session ``key``."""
        self._replies.append(protocol_v2.tagged(frame, protocol_v2.tag(key)))
        self.unsent += 1
        self._wake_writer()

    def encoded(self, replies: str, count: int) -> None:
        """Queue ``count`` replies encoded together (``protocol_v2.replies_frame``)."""
        self._replies.append(replies)
        self.unsent += count
        self._wake_writer()

    def untagged(self, frame: str) -> None:
        """Queue a reply about a whole frame (no session)."""
        self._replies.append(frame)
        self.unsent += 1
        self._wake_writer()

    def _wake_writer(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _pending_frame(self) -> str | None:
        replies = self._replies
        if not replies:
            return None
        self._replies = []
        return protocol_v2.frame_of(replies)

    async def _write(self) -> None:
        channel = self._channel
        loop = asyncio.get_running_loop()
        try:
            while True:
                count = self.unsent
                frame = self._pending_frame()
                if frame is None:
                    self._wake = loop.create_future()
                    await self._wake
                    continue
                if channel is None or not channel.send_text(frame):
                    self.sends += 1
                    try:
                        await self._send({"type": "websocket.send", "text": frame})
                    finally:
                        self.sends += 1
                self.unsent -= count
                self._on_sent()
        except GONE:
            self._on_gone()  # the reader hears of it from receive, too

    async def stop(self) -> None:
        """Stop the sending task (what it had not sent stays for ``flush``)."""
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def flush(self, websocket: WebSocket, timeout: float) -> None:
        """Send what is left as one last frame (before a close), within ``timeout``."""
        frame = self._pending_frame()
        if frame is None:
            return
        async with asyncio.timeout(timeout):
            await websocket.send_text(frame)
