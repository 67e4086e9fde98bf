"""The client's side of ``RemoteVectorEnv`` on a v2 server: a session per environment.

All the sessions share one connection (protocol v2, ``openenv/protocol_v2.py``).
A call sends every environment's request and waits for their replies, which
come back in environment order. A server refuses whole a frame of more
requests than its ``max_requests_in_flight`` (4,096 by default), so a call
over more environments goes out in several frames, one after another: the
next is sent once the replies to the last are in, so that the replies the
server cannot send while nobody reads never hold up the request it waits to
read. A frame refused all the same (a server set lower) ends the connection
at once, with the server's reason.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Sequence
from typing import Any

import orjson
from websockets.exceptions import ConnectionClosed

from openenv import protocol_v2
from openenv.adapters.gymnasium.vector_link import UNREADABLE, seconds_until
from openenv.client._base import error_from, ws_url
from openenv.client.blocking_ws import BlockingWebSocket
from openenv.client.mux_wire import MOST_A_FRAME
from openenv.client.sockets import CONNECT_FAILURES, connect_error
from openenv.errors import (
    ConnectionFailedError,
    EnvTimeoutError,
    OpenEnvError,
    SessionClosedError,
)
from openenv.protocol import FATAL_CODES

__all__ = ["Request", "SessionsLink"]

# What one environment asks in a call (``None``: nothing): its kind and data.
Request = tuple[str, dict[str, Any] | None] | None


class _Refused(Exception):
    """The server refused a frame whole (an error naming no session or request)."""


class SessionsLink:
    """``num_envs`` sessions, numbered 0 to ``num_envs - 1``, on one v2 connection."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        timeout: float,
        num_envs: int,
        busy_poll: float,
        connect_timeout: float = 10.0,
    ) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.num_envs = num_envs
        self.broken = False  # a call failed midway (timeout, connection lost)
        # Environments whose sessions the server ended (a fatal error, an idle
        # timeout), and why: asked nothing more, as the server knows them no more.
        self.ended: dict[int, str] = {}
        self._ids = itertools.count()
        url = ws_url(base_url)
        try:
            ws = BlockingWebSocket(
                url,
                headers=headers,
                open_timeout=connect_timeout,
                send_timeout=timeout,
                subprotocols=[protocol_v2.SUBPROTOCOL],
                busy_poll=busy_poll,
            )
        except CONNECT_FAILURES as exc:
            raise connect_error(url, exc, connect_timeout) from None
        if ws.subprotocol != protocol_v2.SUBPROTOCOL:
            ws.close()
            raise ConnectionFailedError(url, "the server does not speak protocol v2")
        self._ws: BlockingWebSocket | None = ws
        try:
            self.exchange([("open", None)] * num_envs)
        except BaseException:
            # Dropping the connection closes the sessions that did open.
            self._ws = None
            ws.close()
            raise

    def exchange(self, requests: Sequence[Request]) -> list[dict[str, Any] | None]:
        """Send every environment's request; the replies in environment order
        (``None`` where nothing was asked). The first error is raised once all
        have answered."""
        replies, error = self.answers(requests)
        if error is not None:
            raise error
        return replies

    def answers(
        self, requests: Sequence[Request], timeout: float | None = None
    ) -> tuple[list[dict[str, Any] | None], Exception | None]:
        """``exchange``'s replies (``None`` also where the request failed) and its
        first error, returned rather than raised: the environments that did answer
        have moved on, whatever another's failure. A lost connection still raises;
        no reply within ``timeout`` (default: ``self.timeout``) is ``EnvTimeoutError``."""
        timeout = self.timeout if timeout is None else timeout
        ws = self._ws
        if ws is None:
            raise SessionClosedError("this vector env is closed")
        call = next(self._ids)
        items = []
        error: Exception | None = None
        for i, request in enumerate(requests):
            if request is not None and i in self.ended:
                if request[0] != "close":
                    error = error or SessionClosedError(
                        f"the server ended the session of environment {i} ({self.ended[i]}); "
                        "it cannot step or reset again: close() this vector env and make another"
                    )
            elif request is not None:
                kind, data = request
                item: dict[str, Any] = {"session": i, "type": kind, "id": call}
                if data is not None:
                    item["data"] = data
                items.append(item)
        replies: list[dict[str, Any] | None] = [None] * len(requests)
        # One bound for the whole call: frames for nobody (late replies, notices)
        # must not put it off, however often they come.
        deadline = time.monotonic() + timeout
        try:
            for start in range(0, len(items), MOST_A_FRAME):
                frame = items[start : start + MOST_A_FRAME]
                error = self._one_frame(ws, frame, call, replies, error, deadline)
        except (_Refused, *UNREADABLE) as exc:
            # As MuxClient: the connection can be trusted no further.
            self.broken = True
            if self._ws is ws:
                self._ws = None
            ws.close()
            why = exc.args[0] if isinstance(exc, _Refused) else f"the connection failed: {exc!r}"
            raise SessionClosedError(why) from None
        except ConnectionClosed as exc:
            self.broken = True
            raise SessionClosedError(f"the server closed the connection ({_why(exc)})") from None
        except TimeoutError:
            self.broken = True
            raise EnvTimeoutError(f"no reply within {timeout}s") from None
        return replies, error

    def close(self) -> None:
        """Close every session (freeing their slots) and the connection; waits for
        the server to close them at most ``connect_timeout``, as ``MuxClient`` does
        (a hung server's slots are freed once the connection is gone)."""
        ws = self._ws
        if ws is None:
            return
        try:
            if not self.broken:  # else the replies may never come: just hang up
                self.answers([("close", None)] * self.num_envs, self.connect_timeout)
        except OpenEnvError:
            pass  # a dead server or a session already gone: hanging up closes the rest
        finally:
            self._ws = None
            ws.close()

    def _one_frame(
        self,
        ws: BlockingWebSocket,
        items: list[dict[str, Any]],
        call: int,
        replies: list[dict[str, Any] | None],
        error: Exception | None,
        deadline: float,
    ) -> Exception | None:
        unanswered = {item["session"]: item["type"] for item in items}
        # The server may have said why before closing: read on after a failed send.
        with contextlib.suppress(ConnectionClosed):
            ws.send(orjson.dumps(items, option=orjson.OPT_SERIALIZE_NUMPY).decode())
        while unanswered:
            frame = ws.recv(timeout=seconds_until(deadline))
            error = _read(frame, call, unanswered, replies, error, self.ended)
        return error


def _read(
    frame: str | bytes,
    call: int,
    unanswered: dict[int, str],
    replies: list[dict[str, Any] | None],
    error: Exception | None,
    ended: dict[int, str],
) -> Exception | None:
    """Take one frame of replies to the call ``call`` (``unanswered``: each
    session still owed a reply, and what it asked); the first error. Sessions
    the server ends go in ``ended``, with why. Raises
    one of ``UNREADABLE`` if the frame is not the protocol, ``_Refused`` if it
    refuses the frame sent."""
    items = orjson.loads(frame)
    if type(items) is not list or not all(type(item) is dict for item in items):
        raise TypeError(f"a frame of replies that is not a JSON array of objects: {frame!r:.80}")
    for reply in items:
        if reply.get("id") != call:
            if reply.get("type") == "error" and "id" not in reply and "session" not in reply:
                # Whose requests it held is not said, and none of them will run.
                raise _Refused(f"the server refused a frame: {error_from(reply['data'])}")
            if reply.get("type") == "closed":
                because = protocol_v2.closed_because(reply)
                _ended(ended, reply, because)
                error = error or SessionClosedError(because)
            continue  # a notice, or a reply the caller gave up on
        session = reply.get("session")
        # (An int, not a bool: True would pass for session 1.)
        kind = unanswered.pop(session, None) if type(session) is int else None
        if kind is None:
            raise LookupError(f"a reply for session {session!r}, which is owed none")
        reply_type = reply.get("type")
        if reply_type == "closed" and kind != "close":  # ended before it answered
            because = protocol_v2.closed_because(reply)
            _ended(ended, reply, because)
            error = error or SessionClosedError(because)
            continue
        data = reply["data"]
        if reply_type == "error":
            failure = error_from(data)
            if data["code"] in FATAL_CODES or failure.details.get("fatal"):
                ended.setdefault(session, str(failure))
            error = error or failure
        elif reply_type != _ANSWERS[kind]:
            raise ValueError(f"a {reply_type!r} in reply to {kind!r}")
        else:
            _check_fields(kind, data)
            replies[session] = reply
    return error


def _ended(ended: dict[int, str], reply: dict[str, Any], because: str) -> None:
    """Note the session a ``closed`` reply or notice ends (its fatal error, if
    one came first, says more than the notice's "after the error above")."""
    session = reply.get("session")
    if type(session) is int:
        ended.setdefault(session, because)


# The reply each request is answered with (else an error, or a session's end).
_ANSWERS = {"open": "opened", "close": "closed", "reset": "observation", "step": "observation"}


def _check_fields(kind: str, data: dict[str, Any]) -> None:
    """``KeyError`` if a reply to ``kind`` lacks what ``reset`` or ``step`` reads of it."""
    if kind not in ("reset", "step"):
        return
    payload = data["observation"]
    needed = ["observation"] if kind == "reset" else ["observation", "terminated", "truncated"]
    missing = [name for name in needed if name not in payload]
    if kind == "step" and "reward" not in data:
        missing.append("reward")
    if missing:
        raise KeyError(f"an observation without {', '.join(missing)}")


def _why(exc: ConnectionClosed) -> str:
    close = exc.rcvd or exc.sent
    return (close.reason or f"close code {close.code}") if close else "no close frame"
