"""The wire of one ``MuxClient`` connection: requests out in shared frames, replies
routed back to the calls that wait for them.

The requests every coroutine makes in one turn of the event loop go out as one
frame. A reader task routes each reply to its caller by request id, marks the
sessions the server closed, and, if the connection drops or speaks something
other than v2, fails every waiting call at once. The reader holds the wire
weakly: a client dropped without ``close()`` is not kept alive by its own reader
(``MuxClient`` cuts the connection then, freeing its sessions' slots).
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import orjson
from websockets.exceptions import ConnectionClosed

from openenv import protocol, protocol_v2
from openenv.client._base import error_from
from openenv.client.sockets import closed_error
from openenv.errors import SessionClosedError

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from openenv.client.mux import MuxSession
    from openenv.client.open_sessions import OpenSessions

__all__ = ["MOST_A_FRAME", "Kind", "MuxWire"]

# Requests in one frame at most: a server refuses a frame of more than its
# max_requests_in_flight whole, and this is its default.
MOST_A_FRAME = 4096

Kind = Literal["open", "close", "reset", "step", "state", "list_tools", "call_tool", "get_prompt"]


class MuxWire:
    """One v2 connection's requests and replies."""

    def __init__(self, ws: ClientConnection, sessions: OpenSessions) -> None:
        self.ws = ws
        # The client's own: the sessions the server has open for it.
        self.sessions = sessions
        self._ids = itertools.count()
        self._waiting: dict[int, tuple[asyncio.Future[dict[str, Any]], MuxSession]] = {}
        self._outbox: list[str] = []
        self._flushing = False
        self.lost: SessionClosedError | None = None
        self.loop = asyncio.get_running_loop()  # the connection's: its calls run there
        self.reader = self.loop.create_task(_read(ws, weakref.ref(self)))

    # -- requests ---------------------------------------------------------------

    def queue(
        self, session: MuxSession, kind: Kind, data: dict[str, Any] | None
    ) -> asyncio.Future[dict[str, Any]]:
        """The future of a request's reply; the request goes out with this turn's frame."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if self.lost is not None:
            future.set_exception(self.lost)
            return future
        if session.closed and kind != "close":
            future.set_exception(SessionClosedError(session.closed_because))
            return future
        request_id = next(self._ids)
        item: dict[str, Any] = {"session": session.key, "type": kind, "id": request_id}
        if data is not None:
            item["data"] = data
        # Encoded before it is awaited: one that cannot be (a set in an action
        # dict) raises here, and leaves no reply waited for that never comes.
        text = protocol.json_text(item)
        self._waiting[request_id] = (future, session)
        self._outbox.append(text)
        self._flush_soon()
        return future

    def close_unheard(self, key: protocol_v2.SessionKey) -> None:
        """Ask the server to close session ``key``; nobody waits for the reply."""
        if self.lost is None:
            self._outbox.append(protocol_v2.request(protocol.request_frame("close"), key))
            self._flush_soon()

    def forget(self, futures: Sequence[asyncio.Future[dict[str, Any]]]) -> None:
        """Stop waiting for these (given up on): a late reply finds nobody, and an
        error already in is not logged as never retrieved."""
        gone = set(futures)
        for request_id, (future, _) in list(self._waiting.items()):
            if future in gone:
                del self._waiting[request_id]
        for future in futures:
            if future.done() and not future.cancelled():
                future.exception()

    def _flush_soon(self) -> None:
        if not self._flushing:  # gather the calls other coroutines make this turn
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flushing = False
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, []
        loop = asyncio.get_running_loop()
        # Sent in order: a session's requests run in the order they were made.
        for start in range(0, len(outbox), MOST_A_FRAME):
            frame = "[" + ",".join(outbox[start : start + MOST_A_FRAME]) + "]"
            loop.create_task(self.ws.send(frame)).add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.lose(exc)

    # -- replies ----------------------------------------------------------------

    def received(self, frame: str | bytes) -> None:
        items = orjson.loads(frame)
        if type(items) is not list or not all(type(item) is dict for item in items):
            # A lone object is what a v1 server answers: said so, rather than
            # as the AttributeError that routing it would raise.
            raise ValueError(
                f"a frame of replies that is not a JSON array of objects: {frame!r:.80}"
            )
        for item in items:
            self._route(item)

    def _route(self, item: dict[str, Any]) -> None:
        key = item.get("session")
        request_id = item.get("id")
        waiting = self._waiting.pop(request_id, None) if request_id is not None else None
        try:
            self._take(item, key, waiting)
        except Exception:
            # Not a reply this client can read: the reader loses the connection,
            # and the call it answered fails with the rest, at once.
            if waiting is not None and request_id is not None and not waiting[0].done():
                self._waiting[request_id] = waiting
            raise

    def _take(
        self,
        item: dict[str, Any],
        key: protocol_v2.SessionKey | None,
        waiting: tuple[asyncio.Future[dict[str, Any]], MuxSession] | None,
    ) -> None:
        request_id, kind = item.get("id"), item.get("type")
        if key is None and request_id is None and kind == "error":
            # A frame refused whole (more requests than this server takes in
            # one): whose calls it held is not said, and they never run.
            raise error_from(item["data"])
        if kind == "closed":
            because = protocol_v2.closed_because(item)
            session = self.sessions.pop(key, None) if key is not None else None
            if session is not None:
                session.closed = True
                session.closed_because = because
                if request_id is None:  # the server ended it: what it still awaits never comes
                    self._fail_pending(session)
        if waiting is None:
            if kind == "opened" and key is not None and key not in self.sessions:
                # Opened after its caller gave up (a timeout while it waited in line
                # for a slot): nobody will use or close it, so close it now.
                self.close_unheard(key)
            return
        future, session = waiting
        if key != session.key and not (key is None and kind == "error"):
            # Routed by its id alone, it would hand one session's result to
            # another's caller (and a "closed" would end the wrong session).
            raise ValueError(f"a reply for session {key!r} to a request of session {session.key!r}")
        if kind == "opened":
            # Open from here, even if its caller gives up before it hears so.
            session.session_id = item["data"]["session_id"]
            self.sessions[session.key] = session
        if future.done():
            return
        if kind == "error":
            future.set_exception(error_from(item["data"]))
        else:
            item.pop("session", None)  # handed on (and recorded) as the v1 reply it stands for
            future.set_result(item)

    def _fail_pending(self, session: MuxSession) -> None:
        for request_id, (future, owner) in list(self._waiting.items()):
            if owner is session:
                del self._waiting[request_id]
                if not future.done():
                    future.set_exception(SessionClosedError(session.closed_because))

    def lose(self, exc: BaseException | None) -> None:
        """The connection is gone (``exc`` why): every waiting call and session hears of it."""
        if isinstance(exc, ConnectionClosed):
            lost = closed_error(exc)
        elif exc is None:
            lost = SessionClosedError("the connection closed")
        else:
            lost = SessionClosedError(f"the connection failed: {exc!r}")
        if self.lost is None:
            self.lost = lost
        waiting, self._waiting = self._waiting, {}
        for future, _ in waiting.values():
            if not future.done():
                future.set_exception(lost)
        for session in self.sessions.values():
            session.closed = True
            session.closed_because = lost.reason


async def _read(ws: ClientConnection, wire: weakref.ref[MuxWire]) -> None:
    # Holds its wire only while routing a frame, never while it waits for one.
    failure: BaseException | None = None
    try:
        while True:
            # Not ``async for``: it ends silently on a normal close (1000, 1001),
            # and the server's code and reason (shutting down, say) would be lost.
            frame = await ws.recv()
            routing = wire()
            if routing is None:
                return  # its client was dropped (and the connection cut)
            routing.received(frame)
            del routing
    except Exception as exc:  # a drop, or a malformed frame: every caller hears of it
        failure = exc
    routing = wire()
    if routing is not None:
        routing.lose(failure)
