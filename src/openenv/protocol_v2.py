"""The wire protocol v2: many sessions on one connection, many requests per frame.

A client asks for it with the WebSocket subprotocol ``openenv.v2`` on the
same ``/ws`` route; a client that does not (every v1 client, OpenEnv's
included) gets v1 from ``protocol.py``, byte for byte. A v2 connection
starts with no session and takes no slot; the cap counts sessions.

**Client to server.** A frame is a JSON array of requests (a lone request
object is taken as an array of one). A request is a v1 request with one more
field, ``session``: the client's own name for a session on this connection
(a string or an integer; names are per connection). Two more types open and
close sessions::

    [{"session": 0, "type": "open", "id": 1},
     {"session": 1, "type": "open", "id": 2}]
    [{"session": 0, "type": "reset", "data": {"seed": 7}, "id": 3},
     {"session": 1, "type": "step", "data": {"message": "hi"}, "id": 4}]
    [{"session": 1, "type": "close", "id": 5}]

``open`` takes a slot (waiting in line up to the server's ``queue_timeout``)
and makes the session's environment; ``close`` closes it and frees the slot.

**Server to client.** A frame is a JSON array of replies; each is the v1
reply to one request plus its ``session`` (and the request's ``id``), and
two more types: ``opened`` (``data.session_id``, the server's id for the
session, as in its logs) and ``closed`` (``data.reason``, ``data.code``,
``data.message``). A ``closed`` without an ``id`` is the server's own
notice: the session ended (an idle timeout, a shutdown, a fatal error just
reported), and its name is free again.

**Order and fairness.** Requests of one session are served one at a time, in
order. Requests of different sessions run concurrently, whichever frames
they came in: each reply is sent as soon as it is ready, and replies ready
at the same moment share a frame. So a slow environment delays its own
replies and nobody else's, and a batch of quick steps comes back as one
frame.

**Errors.** Every error reply is about one request and one session, as in
v1: a ``VALIDATION_ERROR`` or a crashing environment touches no other
session. A fatal one (``FATAL_CODES``, a ``TIMEOUT`` marked ``fatal``) is
followed by a ``closed`` notice for that session only. A frame that is not
a JSON array of request objects is answered by one error reply without a
``session``; too many of those in a row close the connection (1008), as too
many bad frames close a v1 session. Closing the connection closes all its
sessions.

>>> frame = request('{"type":"step","data":{"x":1},"id":4}', 1)
>>> frame
'{"session":1,"type":"step","data":{"x":1},"id":4}'
>>> split_frame("[" + frame + "]")
[{'session': 1, 'type': 'step', 'data': {'x': 1}, 'id': 4}]
>>> tagged('{"type":"state","data":{},"id":2}', tag(0))
'{"session":0,"type":"state","data":{},"id":2}'
"""

from __future__ import annotations

from typing import Any

import orjson

from openenv.protocol import CloseCode, ErrorCode, FrameError, RequestId
from openenv.protocol_json import frame_text

__all__ = [
    "SUBPROTOCOL",
    "SessionKey",
    "closed_because",
    "closed_frame",
    "frame_of",
    "opened_frame",
    "replies_frame",
    "request",
    "session_key",
    "split_frame",
    "tag",
    "tagged",
]

SUBPROTOCOL = "openenv.v2"

SessionKey = int | str
"""The client's name for a session on its connection."""


def split_frame(frame: str | bytes, max_requests: int | None = None) -> list[Any]:
    """The requests in a client frame, each still to be checked (``session_key``).

    Raises ``FrameError`` when the frame is not JSON, not an array or a
    request object, or holds more than ``max_requests``.
    """
    try:
        value = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise FrameError(ErrorCode.INVALID_JSON, f"frame is not valid JSON: {exc}") from None
    if type(value) is dict:
        return [value]
    if type(value) is not list:
        raise FrameError(
            ErrorCode.INVALID_JSON,
            f"a v2 frame must be a JSON array of requests, got {type(value).__name__}",
        )
    if max_requests is not None and len(value) > max_requests:
        raise FrameError(
            ErrorCode.VALIDATION_ERROR,
            f"a frame may carry at most {max_requests} requests, this one has {len(value)}",
        )
    return value


def session_key(item: Any) -> SessionKey:
    """The ``session`` of one request; ``FrameError`` if it has none usable."""
    if type(item) is not dict:
        raise FrameError(
            ErrorCode.VALIDATION_ERROR,
            f"each request must be a JSON object, got {type(item).__name__}",
        )
    key = item.get("session")
    if type(key) is int or (type(key) is str and len(key) <= 256):
        return key
    request_id = item.get("id")
    raise FrameError(
        ErrorCode.VALIDATION_ERROR,
        "each request needs a 'session': the client's name for the session, "
        "an integer or a string of up to 256 characters",
        request_id=request_id if type(request_id) in (int, str) else None,
    )


def _key_text(key: SessionKey) -> str:
    return str(key) if type(key) is int else orjson.dumps(key).decode()


def tag(key: SessionKey) -> str:
    """What ``tagged`` puts in front of a reply of session ``key``.

    >>> tagged('{"type":"observation"}', tag("a"))
    '{"session":"a","type":"observation"}'
    """
    return '{"session":' + _key_text(key) + ","


def tagged(frame: str, prefix: str) -> str:
    """A v1 reply (an object) as a reply of the session whose ``tag`` is ``prefix``."""
    return prefix + frame[1:]


def replies_frame(replies: list[dict[str, Any]]) -> str:
    """Replies not yet encoded (``protocol.observation_reply``), encoded at once
    as a frame: a JSON array, which ``frame_of`` sends as it is when nothing else
    goes with it.

    >>> replies_frame([{"session": 0, "type": "opened"}, {"session": 1, "type": "opened"}])
    '[{"session":0,"type":"opened"},{"session":1,"type":"opened"}]'
    """
    return frame_text(replies)


def frame_of(pieces: list[str]) -> str:
    """One frame of ``pieces``, in order: each a reply (an object: ``tagged``, an
    error) or replies encoded together (an array: ``replies_frame``).

    A lone array (the replies of one batch) is the frame itself, not copied:
    cutting its brackets off and adding them back copied a frame of 64 echo
    replies three times, 0.5% of a v2 echo step's instructions
    (``benchmarks/v2_path.py --instructions``).

    >>> frame_of(['[{"session":0},{"session":1}]'])
    '[{"session":0},{"session":1}]'
    >>> frame_of(['{"session":2}', '[{"session":0},{"session":1}]'])
    '[{"session":2},{"session":0},{"session":1}]'
    """
    if len(pieces) == 1 and pieces[0][0] == "[":
        return pieces[0]
    return "[" + ",".join(p[1:-1] if p[0] == "[" else p for p in pieces if p != "[]") + "]"


def request(frame: str, key: SessionKey) -> str:
    """A v1 frame (``protocol.request_frame``, an object) as a request of session ``key``."""
    return tagged(frame, tag(key))


def opened_frame(session_id: str, request_id: RequestId | None) -> str:
    """The reply to ``open`` (untagged; ``tagged`` adds the session)."""
    return _frame("opened", {"session_id": session_id}, request_id)


def closed_frame(
    reason: str,
    code: CloseCode = CloseCode.NORMAL,
    message: str = "",
    request_id: RequestId | None = None,
) -> str:
    """The reply to ``close``, or (without ``request_id``) the server's notice."""
    return _frame("closed", {"reason": reason, "code": int(code), "message": message}, request_id)


def closed_because(reply: dict[str, Any]) -> str:
    """Why a ``closed`` reply or notice ended its session: its message, else its
    reason. ``ValueError`` naming the reply if it says neither (a server that
    does not speak this protocol), rather than whatever reading it would raise."""
    data = reply.get("data")
    because = (data.get("message") or data.get("reason")) if type(data) is dict else None
    if not because or not isinstance(because, str):
        raise ValueError(f"a 'closed' without a message or reason in its data: {reply!r:.120}")
    return because


def _frame(kind: str, data: dict[str, Any], request_id: RequestId | None) -> str:
    frame: dict[str, Any] = {"type": kind, "data": data}
    if request_id is not None:
        frame["id"] = request_id
    return frame_text(frame)
