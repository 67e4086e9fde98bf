"""A v2 connection: many sessions on one WebSocket, replies sent as they finish.

The wire is in ``protocol_v2.py``. Here each session of the connection is a
``Lane``: its ``Session`` (the same one ``/ws`` v1 drives, so deadlines,
errors, tools and recording behave alike), and the requests waiting their
turn. A lane with work has one task that serves its requests in order and
ends when none is left, so an idle session costs no task. The plain ``def``
steps of a frame for idle sessions skip the tasks: they go to the worker
threads together, as one batch (``FrameSteps``, ``Handoff.dispatch_batch``).
Replies go to the connection's ``Outbox`` (``server/mux_writer.py``) as they
finish, so a slow environment holds back only its own reply.

The connection reads no further frame while ``max_requests_in_flight``
requests are unanswered or their replies wait to go out: a client that floods
it and reads nothing waits on TCP, not on the server's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any

from starlette.types import Receive, Send
from starlette.websockets import WebSocket

from openenv import protocol, protocol_v2
from openenv.protocol import CloseCode, ErrorCode, FrameError
from openenv.protocol_v2 import SessionKey
from openenv.server.direct import NOTIFY, DirectChannel
from openenv.server.leaving import CancelsWhenLeft
from openenv.server.mux_ending import ConnectionEnding
from openenv.server.mux_writer import GONE, Outbox
from openenv.server.service import EnvService, SessionRefused
from openenv.server.session_host import OPEN
from openenv.server.sessions import Session
from openenv.server.step_batches import StepBatch

__all__ = ["FrameSteps", "Lane", "MuxConnection"]

logger = logging.getLogger("openenv.server")

_GONE = GONE


class Lane:
    """One session of a v2 connection and the requests waiting for it."""

    __slots__ = ("admitted", "connection", "key", "queue", "session", "task")

    def __init__(self, connection: MuxConnection, key: SessionKey) -> None:
        self.connection = connection
        self.key = key
        self.admitted = False  # holds a slot (its environment may still be in the making)
        self.session: Session | None = None  # None while it opens
        self.queue: deque[dict[str, Any]] = deque()
        self.task: asyncio.Task[None] | None = None  # serving the queue, if any

    def stepped(self, reply: str) -> None:
        self.connection._stepped(self, reply)


class FrameSteps(StepBatch):
    """The plain ``def`` steps of one frame, handed to the worker threads together;
    replies go to the outbox as soon as their steps return."""

    __slots__ = ("connection",)

    def __init__(self, connection: MuxConnection) -> None:
        super().__init__()
        self.connection = connection

    def encoded(self, replies: list[dict[str, Any]]) -> None:
        connection = self.connection
        connection.outbox.encoded(protocol_v2.replies_frame(replies), len(replies))
        connection._answered(len(replies))

    def replied(self, owner: Lane, frame: str) -> None:
        self.connection._stepped(owner, frame)


class MuxConnection(ConnectionEnding):
    """The I/O of one v2 connection; every session of it is a ``Lane``."""

    def __init__(
        self,
        websocket: WebSocket,
        service: EnvService,
        receive: Receive,
        send: Send,
        channel: DirectChannel | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.websocket = websocket
        self._service = service
        self._receive, self._send, self._channel = receive, send, channel
        settings = service.settings
        self._max_size = settings.max_message_size
        self._max_in_flight = settings.max_requests_in_flight
        self._max_bad = settings.max_bad_frames
        self.lanes: dict[SessionKey, Lane] = {}
        self.closed: asyncio.Future[None] = loop.create_future()
        self.outbox = Outbox(send, channel, self._peer_gone, self._wake_reader)
        self._room: asyncio.Future[None] | None = None  # the reader, waiting for room
        self._waiting_for_room = False
        self._in_flight = 0
        self._bad_frames = 0
        self._gone = False  # the peer left, or the connection is ending
        self._ending: str | None = None  # why every session is being closed
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def sends(self) -> int:
        return self.outbox.sends

    def _peer_gone(self) -> None:
        self._gone = True
        self._wake_reader()  # no reply will go out now: it reads the disconnect

    def _wake_reader(self) -> None:
        room = self._room
        if room is not None and not room.done() and (self._gone or self._has_room()):
            room.set_result(None)

    def _has_room(self) -> bool:
        # Replies made and not yet sent count too: a client that reads none
        # would otherwise have them buffered here without bound.
        return self._in_flight + self.outbox.unsent < self._max_in_flight

    # -- the reader ------------------------------------------------------------

    async def run(self) -> None:
        self._task = asyncio.current_task()
        self.outbox.start()
        reason = "disconnect"
        try:
            while True:
                if not self._has_room() and not self._gone:
                    await self._wait_for_room()
                message = await self._next_message()
                kind = message["type"]
                if kind == "websocket.disconnect" or self._ending is not None:
                    break
                if kind == NOTIFY:
                    continue
                frame = message.get("text")
                if frame is None:
                    frame = message.get("bytes") or b""
                if len(frame) > self._max_size:
                    logger.warning("v2 frame of %d exceeds %d; closing", len(frame), self._max_size)
                    reason = "message_too_big"
                    await self._close_socket(CloseCode.MESSAGE_TOO_BIG)
                    break
                if not self._take(frame):
                    reason = "error"
                    await self._flush_and_close(CloseCode.POLICY_VIOLATION)
                    break
        except _GONE:
            pass
        except Exception:
            reason = "internal_error"
            logger.exception("internal error on a v2 connection")
            await self._flush_and_close(CloseCode.INTERNAL_ERROR)
        finally:
            # Every session is closed exactly once, even if this task is cancelled
            # again meanwhile (a stall, a shutdown): abort() makes it quick.
            ending = asyncio.ensure_future(self._end_all(self._ending or reason))
            while not ending.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(ending)
            await self.outbox.stop()
            if not self.closed.done():
                self.closed.set_result(None)

    @property
    def paused(self) -> bool:
        """Not read until replies go out (the reader waits for room, a reply waits
        on the peer, or what was sent does): ``openenv_v2_connections_paused``."""
        channel = self._channel
        return (
            self._waiting_for_room
            or bool(self.outbox.sends & 1)
            or (channel is not None and channel.write_blocked())
        )

    async def _wait_for_room(self) -> None:
        """Read no more until replies go out (a client that vanished meanwhile is
        seen after that: what it queued is answered first)."""
        self._waiting_for_room = True
        try:
            while not self._has_room() and not self._gone:
                self._room = asyncio.get_running_loop().create_future()
                await self._room
        finally:
            self._waiting_for_room = False

    async def _next_message(self) -> Any:
        channel = self._channel
        if channel is None:
            return await self._receive()
        while (message := channel.receive_nowait()) is None:
            await channel.arrival()
        return message

    def _take(self, frame: str | bytes) -> bool:
        """Start every request of a frame; ``False``: too many bad frames in a row."""
        try:
            items = protocol_v2.split_frame(frame, self._max_in_flight)
        except FrameError as exc:
            return self._refuse_frame(exc)
        steps = FrameSteps(self)
        bad = steps.take_frame(items, self.lanes, self._start, self._error_untagged)
        if steps.calls:
            self._in_flight += len(steps.calls)
            self._service.handoff.dispatch_batch(steps.calls, steps)
        if bad and bad == len(items):
            return self._refuse_frame(None)
        self._bad_frames = 0
        return True

    def _refuse_frame(self, exc: FrameError | None) -> bool:
        self._bad_frames += 1
        if exc is not None:
            self._error_untagged(exc)
        if self._bad_frames < self._max_bad:
            return True
        logger.warning("closing a v2 connection after %d bad frames in a row", self._bad_frames)
        self._service.metrics.errors[ErrorCode.SESSION_ERROR.value] += 1
        self.outbox.untagged(
            protocol.error_frame(
                ErrorCode.SESSION_ERROR,
                f"closing the connection after {self._bad_frames} bad frames in a row",
            )
        )
        return False

    def _error(self, code: ErrorCode, message: str, item: dict[str, Any]) -> str:
        """An error reply to ``item``, counted in ``openenv_errors`` as v1's are."""
        self._service.metrics.errors[code.value] += 1
        return protocol.error_frame(code, message, request_id=_request_id(item))

    def _error_untagged(self, exc: FrameError) -> None:
        self._service.metrics.errors[exc.code.value] += 1
        self.outbox.untagged(
            protocol.error_frame(exc.code, exc.message, request_id=exc.request_id, **exc.details)
        )

    def _start(self, key: SessionKey, item: dict[str, Any], lane: Lane | None) -> None:
        # An ``open`` of a name in use waits its turn like any request of it: a
        # ``close`` before it frees the name (``_hand_on``), else it is refused then.
        if lane is None and item.get("type") == "open":
            lane = self.lanes[key] = Lane(self, key)
        elif lane is None:
            self._reply(key, self._error(ErrorCode.SESSION_ERROR, _not_open(key), item))
            return
        self._in_flight += 1
        if lane.task is None:
            session = lane.session
            # A plain step of an async def starts at once, and its reply comes
            # from the callback that brings the result: no task to wake.
            if session is not None and session.try_step_request(item, lane.stepped):
                return
            lane.queue.append(item)
            lane.task = self._spawn(self._serve(lane))
        else:
            lane.queue.append(item)

    # -- the lanes -------------------------------------------------------------

    async def _serve(self, lane: Lane) -> None:
        """Serve a lane's requests in order until none is left (or it closes)."""
        try:
            while lane.queue:
                session = lane.session
                if session is not None and session.busy:
                    await session.settled()  # a step the fast path started
                    continue  # the queue may have been dropped meanwhile
                if session is not None and self.lanes.get(lane.key) is not lane:
                    break  # it ended (that step's error): what waits is refused below
                item = lane.queue.popleft()
                try:
                    reply = await self._answer(lane, item)
                finally:
                    self._answered()
                if reply is not None:
                    self._reply(lane.key, reply)
                if self.lanes.get(lane.key) is not lane:
                    break
            self._hand_on(lane)  # the session is gone; anything left waited for it
        finally:
            lane.task = None

    def _hand_on(self, lane: Lane) -> None:
        """``lane``'s session has ended and its name is free: refuse what waited
        for it, up to an ``open`` of the name, which begins a new lane with the
        rest, in order (``close`` then ``open`` may come in one frame)."""
        queue = lane.queue
        while queue:
            if queue[0].get("type") == "open" and lane.key not in self.lanes and not self._gone:
                successor = self.lanes[lane.key] = Lane(self, lane.key)
                successor.queue, lane.queue = queue, deque()
                successor.task = self._spawn(self._serve(successor))
                return
            left = queue.popleft()
            self._answered()
            self._reply(lane.key, self._error(ErrorCode.SESSION_ERROR, _not_open(lane.key), left))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task of this connection's, which ``_end_all`` waits for."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _answered(self, count: int = 1) -> None:
        self._in_flight -= count
        self._wake_reader()

    def _stepped(self, lane: Lane, reply: str) -> None:
        """The reply of a step the fast path started (``Session.try_step_request``)."""
        self._answered()
        self._reply(lane.key, reply)
        session = lane.session
        if session is not None and session.state is not OPEN and self.lanes.get(lane.key) is lane:
            # It ended the session: the notice goes in the same frame as its error.
            self._spawn(session.aclose(self._announce_end(lane)))

    async def _answer(self, lane: Lane, item: dict[str, Any]) -> str | None:
        kind = item.get("type")
        request_id = _request_id(item)
        if kind == "open":
            if lane.session is not None:
                return self._error(ErrorCode.VALIDATION_ERROR, _already_open(lane.key), item)
            return await self._open(lane, request_id)
        session = lane.session
        assert session is not None
        if kind == "close":
            await self._close_lane(lane, "client_close")
            return protocol_v2.closed_frame("client_close", request_id=request_id)
        reply = await session.handle_request(item)
        if session.state is not OPEN:
            if reply is not None:
                self._reply(lane.key, reply)
            await self._end_lane(lane)
            return None
        return reply

    async def _end_lane(self, lane: Lane) -> None:
        """The session ended itself (a fatal error): say so at once, then close it
        (which may wait for a call still running on a thread)."""
        assert lane.session is not None
        await lane.session.aclose(self._announce_end(lane))

    def _announce_end(self, lane: Lane) -> str:
        """Free the name of a session that ended itself and send its ``closed``
        notice; the reason to close it with."""
        session = lane.session
        assert session is not None
        if self.lanes.get(lane.key) is lane:
            del self.lanes[lane.key]  # its name is free from here
        reason = "error" if session.close_code is not CloseCode.NORMAL else "client_close"
        self._reply(
            lane.key,
            protocol_v2.closed_frame(
                reason, session.close_code, "the session ended after the error above"
            ),
        )
        # What waited for it is answered now, not once close() is done: that
        # waits for a call still running on a thread, which may never return.
        self._hand_on(lane)
        return reason

    async def _open(self, lane: Lane, request_id: protocol.RequestId | None) -> str:
        service = self._service
        try:
            await service.admit(CancelsWhenLeft(lambda: self._gone))
            lane.admitted = True
            session = await service.make_session()
        except SessionRefused as refused:
            del self.lanes[lane.key]
            return protocol.error_frame(
                refused.code, refused.message, request_id=request_id, **refused.details
            )
        lane.session = session
        if self._gone:  # the connection ended while the environment was made
            await self._close_lane(lane, self._ending or "disconnect")
            return protocol_v2.closed_frame("disconnect", request_id=request_id)
        return protocol_v2.opened_frame(session.id, request_id)

    async def _close_lane(self, lane: Lane, reason: str) -> None:
        """Close ``lane``'s session. Its name stays taken until it has closed, so
        what is sent for the name meanwhile waits its turn behind the close."""
        try:
            if lane.session is not None:
                await lane.session.aclose(reason)
        finally:
            if self.lanes.get(lane.key) is lane:
                del self.lanes[lane.key]

    def _reply(self, key: SessionKey, frame: str) -> None:
        self.outbox.reply(key, frame)


def _request_id(item: dict[str, Any]) -> protocol.RequestId | None:
    request_id = item.get("id")
    return request_id if type(request_id) in (int, str) else None


def _already_open(key: SessionKey) -> str:
    return f"session {key!r} is already open on this connection; close it or use another name"


def _not_open(key: SessionKey) -> str:
    return f"no open session {key!r} on this connection; send an 'open' request for it first"
