"""HTTP request bodies read up to a limit, for the routes that take one (MCP,
OpenReward, OpenEnv's ``POST /reset`` and ``/step``).

Neither uvicorn nor Starlette bounds a request body, so a route that reads
one whole would hold whatever a client sends. ``read_body`` refuses a body
whose ``Content-Length`` is over the limit before reading any of it, and one
sent without (chunked) as soon as it passes the limit, so a client that
announces a gigabyte, or streams for ever, costs the server ``limit`` bytes.
Once it is read, ``client_gone`` tells when the client has left since.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive, Scope

from openenv.errors import OpenEnvError

__all__ = ["BodyTooLarge", "client_gone", "read_body", "replay", "route_body"]


class BodyTooLarge(OpenEnvError):
    """A request body over the limit; ``str()`` says so, for a 413's message."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes (max_message_size)")
        self.limit = limit


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body of an HTTP request, if it is at most ``limit`` bytes.

    Raises ``BodyTooLarge`` past the limit and Starlette's ``ClientDisconnect``
    if the client leaves first.
    """
    declared = Headers(scope=scope).get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        body += message.get("body", b"")
        if len(body) > limit:
            raise BodyTooLarge(limit)
        if not message.get("more_body", False):
            return bytes(body)


async def route_body(request: Request, limit: int) -> bytes:
    """``read_body`` for a route: past the limit a 413, and a 400 for a client that
    left before its whole body came, which Starlette answers quietly (the client
    is gone) instead of logging a traceback for each."""
    try:
        return await read_body(request.scope, request.receive, limit)
    except BodyTooLarge as exc:
        raise HTTPException(413, str(exc)) from None
    except ClientDisconnect:
        raise HTTPException(400, "the client left before sending its whole body") from None


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` (already read) first, then what ``receive`` gives:
    for the app a request is handed to next, which may read it again and then wait
    for the client's disconnect."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


@contextlib.asynccontextmanager
async def client_gone(
    receive: Receive, left: asyncio.Event | None = None
) -> AsyncIterator[asyncio.Event]:
    """Set once the client of a request has left: for ``open_session``, so that a
    caller who gives up while it waits in line for a slot leaves the line at once.

    ``left``, when given, is the event to set: one that something else (a
    ``/delete`` of the session being opened) may set as well.
    For a request whose body has been read whole, or is not wanted: what is
    left of it is read and dropped.
    """
    left = asyncio.Event() if left is None else left

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        left.set()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        yield left
    finally:
        watcher.cancel()
