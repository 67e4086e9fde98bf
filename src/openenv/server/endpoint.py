"""The ``/ws`` endpoint: one WebSocket connection, one session, one environment.

Each session has a task that receives a frame, has its ``Session`` handle it
and sends the reply. On openenv's WebSocket protocol a step skips that task:
the protocol offers the frame to ``Connection._take`` from its own callback
(``Session.try_step``). A plain ``def`` step goes to a worker thread, and its
reply is sent from the batch that brings its result back; an ``async def``
step runs there and then, in an eager task of its own (or, on Python 3.11, as
a part of the session's task), and replies at once unless it suspends
(``server/direct_steps.py``).

No send waits on the client for longer than ``send_timeout``: openenv's
protocol aborts a connection whose peer leaves its write buffer full that
long (``server/wsprotocol.py``); under other ASGI servers, a reply that
waits that long is found by the service's sweep (``stall``), and every close
here has the same deadline, so a client that stops reading loses its session
and its slot either way.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any
from urllib.parse import parse_qs

from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from openenv import protocol, protocol_v2
from openenv.protocol import CloseCode, ErrorCode
from openenv.protocol_mcp_sessions import SESSION_QUERY
from openenv.server.direct import DIRECT, NOTIFY, DirectChannel
from openenv.server.leaving import ChannelLeft
from openenv.server.mux import MuxConnection
from openenv.server.security import route_path
from openenv.server.service import EnvService, SessionRefused
from openenv.server.session_host import OPEN
from openenv.server.sessions import Session, SessionState
from openenv.server.shared_session import SharedSession

__all__ = ["PAGE_READS", "SUBPROTOCOL", "Connection", "SessionEndpoint"]

SUBPROTOCOL = "openenv"
# What the web page asks of its session by itself, never at its player's
# word: whether the session is open yet (a list_tools, while it waits in the
# admission queue) and the state panel (after each reset and step). A
# recording (record=) leaves them out of /web/ws sessions: a list_tools before
# the first reset read back as an episode of its own.
PAGE_READS = frozenset({"list_tools", "state"})

logger = logging.getLogger("openenv.server")

# What a send to a socket whose peer is gone raises, depending on the ASGI server.
_GONE = (WebSocketDisconnect, OSError, RuntimeError)


class SessionEndpoint:
    """ASGI app for a session route; the environment comes from ``app.state.openenv``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service: EnvService = scope["app"].state.openenv
        websocket = WebSocket(scope, receive, send)
        # Browsers insist the server picks one of the subprotocols they offer.
        offered = scope.get("subprotocols") or ()
        multiplexed = protocol_v2.SUBPROTOCOL in offered
        if multiplexed:
            await websocket.accept(subprotocol=protocol_v2.SUBPROTOCOL)
        else:
            await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        channel = scope["extensions"].get(DIRECT) if "extensions" in scope else None
        if channel is not None:
            channel.set_send_timeout(service.settings.send_timeout)
        if multiplexed:
            await _serve(service, MuxConnection(websocket, service, receive, send, channel))
            return
        try:
            if service.attach_session is not None and (sid := _attaching(scope)) is not None:
                session = service.attach_session(sid)  # decided here, once: no cost per step
            else:
                session = await service.open_session(
                    ChannelLeft(channel) if channel is not None else None
                )
        except SessionRefused as refused:
            await _refuse(websocket, refused, service.settings.send_timeout)
            return
        if route_path(scope) == "/web/ws":
            session.unrecorded = PAGE_READS
        await _serve(service, Connection(websocket, session, service, receive, send, channel))


def _attaching(scope: Scope) -> str | None:
    """The session ``/ws?session_id=<id>`` attaches to (``None``: a new one)."""
    query = scope.get("query_string", b"")
    if not query:
        return None
    values = parse_qs(query.decode("latin-1"), keep_blank_values=True).get(SESSION_QUERY)
    return values[-1] if values else None


async def _serve(service: EnvService, connection: Connection | MuxConnection) -> None:
    service.connections.add(connection)
    try:
        # The connection's own task: waking it for each frame resumes a short
        # stack, not the dozen or so middleware frames above this one
        # (cancelling this task cancels that one, too). A v1 connection's
        # context is kept, for the steps that run as a part of it from a callback.
        context = connection.context if isinstance(connection, Connection) else None
        await asyncio.get_running_loop().create_task(connection.run(), context=context)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        # else: a shutdown past its deadline ended the connection's task (abort()).
    finally:
        service.connections.discard(connection)


class Connection:
    """The I/O around one ``Session``: receive a frame, handle it, send the reply."""

    def __init__(
        self,
        websocket: WebSocket,
        session: Session,
        service: EnvService,
        receive: Receive,
        send: Send,
        channel: DirectChannel | None = None,
    ) -> None:
        self.websocket = websocket
        # The frames of a session go through the raw ASGI callables: Starlette's
        # WebSocket checks its state machine on every call, which costs a few
        # percent of a cheap step. It still handles accept and close.
        self._receive = receive
        self._send = send
        self.session = session
        # Done once the session has ended and its slot is free (a future, not an
        # Event: one per connection, and an Event carries a 600-byte deque).
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._max_size = service.settings.max_message_size
        self._send_timeout = service.settings.send_timeout
        # Odd while a reply waits on the client (``Served.sends``): a count, not
        # a clock read per reply.
        self.sends = 0
        self._stalled = False
        self._expired_for: str | None = None
        # openenv's WebSocket protocol offers each data frame to _take first: a
        # plain step then runs and replies from callbacks, with no task to wake.
        self._channel = channel if session.direct_steps else None
        # Frames in and replies out through the same channel, for every session:
        # no coroutine per message or reply (ASGI receive/send stay the fallback).
        self._inbox = channel
        self._waiting = False  # run() is parked in receive(), with nothing else to do
        self.context = contextvars.copy_context()  # run()'s, and its steps'
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        reason = "disconnect"
        session = self.session
        receive, send = self._receive, self._send
        channel, inbox = self._channel, self._inbox
        self._task = asyncio.current_task()
        if channel is not None:
            channel.take_frames(self._take)
        try:
            while True:
                if inbox is None:
                    message = await receive()
                else:
                    self._waiting = True  # only _take reads it, with a channel
                    try:
                        while (message := inbox.receive_nowait()) is None:
                            await inbox.arrival()
                    except asyncio.CancelledError as cancelled:
                        if not session.suspended:
                            raise
                        # Before this task took over the step _take started in
                        # it: the step hears of it (its asyncio.timeout may be why).
                        self._waiting = False
                        await session.settled(cancelled)
                        continue
                    self._waiting = False
                kind = message["type"]
                if kind == "websocket.disconnect":
                    break
                if session.state is not OPEN:
                    if kind == NOTIFY and self._expired_for is None:
                        # A step started by _take ended the session; its error is sent.
                        reason = "internal_error"
                        await self._close_socket(session.close_code)
                    elif self._expired_for is None and isinstance(session, SharedSession):
                        # Ended over HTTP (a fatal tool call): its error, not a dropped socket.
                        reason = "error"
                        frame = message.get("text") or message.get("bytes") or b""
                        ended = await session.handle(frame)
                        assert ended is not None
                        await self._send_and_close(ended, session.close_code)
                    break  # expired by the reaper or a shutdown while this frame was in flight
                if kind == NOTIFY:
                    if session.suspended:
                        await session.settled()  # an async def step _take started in this task
                    continue
                frame = message.get("text")
                if frame is None:
                    frame = message.get("bytes") or b""
                if len(frame) > self._max_size:
                    # Measured in characters for text frames: a cheap, safe
                    # lower bound on the bytes that arrived.
                    session.log.warning(
                        "frame of %d exceeds %d; closing", len(frame), self._max_size
                    )
                    reason = "message_too_big"
                    await self._close_socket(CloseCode.MESSAGE_TOO_BIG)
                    break
                if session.busy:
                    await session.settled()  # a frame sent while _take's step ran
                    if session.state is not OPEN:
                        continue  # its NOTIFY is next in line
                reply = await session.handle(frame)
                if reply is None:
                    # Free the slot before the close handshake completes, so a
                    # client whose close() returned can reconnect at once.
                    reason = "client_close"
                    await session.aclose(reason)
                    await self._close_socket(CloseCode.NORMAL)
                    break
                if inbox is None or not inbox.send_text(reply):
                    # No timer per reply: the service sweeps for sends stuck past
                    # send_timeout and stalls their connection (``stall``).
                    self.sends += 1
                    try:
                        await send({"type": "websocket.send", "text": reply})
                    except asyncio.CancelledError:
                        if not self._stalled:
                            raise
                        self._task.uncancel()  # type: ignore[union-attr]
                        raise TimeoutError("send_timeout") from None
                    finally:
                        self.sends += 1
                if session.state is not OPEN:
                    reason = "error"
                    await self._close_socket(session.close_code)
                    break
        except asyncio.CancelledError:
            # A shutdown or a stalled client: a step _take started hears of it
            # too, as it would have inside this task (aclose waits for it).
            session.interrupt()
            raise
        except _GONE:
            pass  # the peer vanished mid-exchange; the slot is freed below
        except Exception:
            reason = "internal_error"
            session.log.exception("internal error")
            await self._close(
                ErrorCode.SESSION_ERROR, "internal server error", CloseCode.INTERNAL_ERROR
            )
        finally:
            self._waiting = False
            if channel is not None:
                channel.take_frames(None)
            try:
                await session.aclose(self._expired_for or reason)
            finally:
                if not self.closed.done():  # a drain that gave up cancels it
                    self.closed.set_result(None)

    def _take(self, frame: str | bytes) -> bool:
        """Start a step from the protocol's callback; ``False``: run() takes the frame."""
        if not self._waiting or len(frame) > self._max_size:
            return False
        session = self.session
        if not session.try_step(frame, self._reply, self._task, self.context):
            return False
        if session.suspended:
            # An async def step started in this task awaits something: the task
            # finishes it.
            self._waiting = False
            channel = self._channel
            assert channel is not None
            channel.notify()
        return True

    def _reply(self, frame: str) -> None:
        channel = self._channel
        assert channel is not None
        channel.send_now(frame)  # False: closing or gone, and run() hears of that
        if self.session.state is not OPEN:
            channel.notify()

    async def expire(self, reason: str) -> None:
        """End the session from outside (idle timeout, shutdown) and free its slot."""
        if self.session.state is not OPEN:
            return
        self.session.state = SessionState.CLOSING
        self._expired_for = reason
        if reason == "idle_timeout":
            message = "session closed after being idle too long"
        else:
            message = "server shutting down"
        self.session.cancel_queued(message)  # a step still waiting for a thread never starts
        await self._close(ErrorCode.SESSION_ERROR, message, CloseCode.GOING_AWAY)
        if not self.session.busy:
            await self.session.aclose(reason)
        # else: a call is in flight; ``run`` frees the slot once it returns, so
        # ``close()`` never overlaps another call of the same environment.

    def idle_closings(self, deadline: float) -> list[Coroutine[Any, Any, None]]:
        session = self.session
        if session.state is not OPEN or session.busy:
            return []
        if session.last_active >= deadline:
            return []
        logger.info("session %s idle over its limit; closing", session.id)
        return [self.expire("idle_timeout")]

    def describe(self, task: asyncio.Task[Any]) -> str | None:
        session = self.session
        return f"session {session.id}" if task in (self._task, session.step_task) else None

    def abort(self) -> None:
        """Drop the connection now (unsent replies and all) and end its task.

        For a shutdown past its deadline: the task's ``finally`` frees the slot.
        """
        self.session.abandon()
        if self._inbox is not None:
            self._inbox.abort()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def stall(self) -> None:
        """A reply has waited on the client past ``send_timeout``: abort the connection.

        The send is cancelled, ``run`` ends as for a vanished peer, and the
        session's slot is freed.
        """
        if self._stalled or self._task is None or self._task.done():
            return
        self._stalled = True
        self.session.log.warning(
            "client did not read a reply within %gs; aborting its connection", self._send_timeout
        )
        if self._inbox is not None:
            self._inbox.abort()
        self._task.cancel()

    def _deadline(self) -> _Bounded:
        """Bound one send: past ``send_timeout`` the connection is aborted and
        ``TimeoutError`` (one of ``_GONE``) raised."""
        return _Bounded(self, self._send_timeout)

    async def _close_socket(self, close_code: CloseCode) -> None:
        async with self._deadline():
            await self.websocket.close(close_code)

    async def _close(self, code: ErrorCode, message: str, close_code: CloseCode) -> None:
        await self._send_and_close(protocol.error_frame(code, message), close_code)

    async def _send_and_close(self, frame: str, close_code: CloseCode) -> None:
        if self.websocket.application_state is WebSocketState.DISCONNECTED:
            return
        try:
            async with self._deadline():
                await self.websocket.send_text(frame)
                await self.websocket.close(close_code)
        except _GONE:
            pass


class _Bounded:
    """``asyncio.timeout`` around one send, aborting the connection when it fires
    (a class, not a generator: under plain uvicorn every reply passes here)."""

    __slots__ = ("_connection", "_timeout")

    def __init__(self, connection: Connection, seconds: float) -> None:
        self._connection = connection
        self._timeout = asyncio.timeout(seconds)

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self._timeout.__aexit__(*exc_info)
        except TimeoutError:
            connection = self._connection
            connection.session.log.warning(
                "client did not read a reply within %gs; aborting its connection",
                connection._send_timeout,
            )
            if connection._inbox is not None:
                connection._inbox.abort()
            raise


async def _refuse(websocket: WebSocket, refused: SessionRefused, send_timeout: float) -> None:
    try:
        async with asyncio.timeout(send_timeout):
            await websocket.send_text(
                protocol.error_frame(refused.code, refused.message, **refused.details)
            )
            await websocket.close(refused.close_code)
    except _GONE:
        pass
