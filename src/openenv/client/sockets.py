"""Opening a client's WebSocket, and naming why one failed or closed, as openenv's errors."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from openenv import protocol
from openenv.errors import (
    AuthenticationError,
    CapacityError,
    ConnectionFailedError,
    OpenEnvError,
    SessionClosedError,
)

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

__all__ = [
    "CONNECT_FAILURES",
    "close_by",
    "closed_error",
    "connect_error",
    "deadline_in",
    "open_socket",
]


def _body(exc: InvalidStatus) -> dict[str, Any]:
    """The JSON object of a refused handshake's body (openenv's has a ``detail``), or ``{}``."""
    try:
        body = orjson.loads(exc.response.body or b"{}")
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


_CLOSE_NAMES = {code.value: code.name.lower().replace("_", " ") for code in protocol.CloseCode}
_CLOSE_NAMES[1012] = "server restarting"


def closed_error(exc: ConnectionClosed) -> SessionClosedError:
    close = exc.rcvd or exc.sent
    if close is None:
        return SessionClosedError("the connection dropped without a close frame")
    reason = close.reason or _CLOSE_NAMES.get(close.code, "closed by the server")
    return SessionClosedError(reason, close_code=close.code)


async def close_by(ws: ClientConnection, deadline: float | None) -> None:
    """``ws.close()``, the TCP connection aborted if it is not done by ``deadline``
    (the loop's clock; ``None``: no limit). websockets' close() first waits for
    what is queued to be written, without a limit, and a server that stopped
    reading never takes it."""
    try:
        async with asyncio.timeout_at(deadline):
            await ws.close()
    except TimeoutError:
        ws.transport.abort()


def deadline_in(seconds: float | None) -> float | None:
    """The running loop's time ``seconds`` from now (``None``: none)."""
    return None if seconds is None else asyncio.get_running_loop().time() + seconds


# What opening a WebSocket raises when it fails: nothing listens, a timeout
# (an OSError too), a refused or cut handshake, an address that is not one.
CONNECT_FAILURES = (OSError, InvalidHandshake, InvalidURI)


async def open_socket(
    url: str, connect_timeout: float, options: Mapping[str, Any]
) -> ClientConnection:
    """Open a WebSocket to a session route; its failures as openenv's errors."""
    try:
        return await _connect(url, **options)
    except CONNECT_FAILURES as exc:
        raise connect_error(url, exc, connect_timeout) from None


def connect_error(url: str, exc: BaseException, connect_timeout: float) -> OpenEnvError:
    """Why opening the WebSocket at ``url`` failed (one of ``CONNECT_FAILURES``),
    as openenv's error; for the clients that open theirs without ``open_socket``."""
    if isinstance(exc, TimeoutError):
        return ConnectionFailedError(url, f"no answer within {connect_timeout}s")
    if isinstance(exc, InvalidURI):
        return ConnectionFailedError(url, str(exc))
    if isinstance(exc, InvalidStatus):
        status, body = exc.response.status_code, _body(exc)
        said = str(body.get("detail") or "")
        if status == 503 and body.get("code") == protocol.ErrorCode.CAPACITY_REACHED.value:
            # A fleet's directory with every replica full: a full server, to retry later.
            details = {k: v for k, v in body.items() if k not in ("detail", "code")}
            return CapacityError(protocol.ErrorCode.CAPACITY_REACHED, said, details)
        if status == 401 or (status == 403 and said):
            return AuthenticationError(url, said or f"HTTP {status}")
        if status in (403, 404):
            # What a server (ours or not) answers an upgrade to a path with no
            # WebSocket route: the URL is wrong, not the key.
            return ConnectionFailedError(
                url,
                f"no openenv session endpoint there (HTTP {status}); "
                f"is this the server's root URL?",
            )
        return ConnectionFailedError(url, f"HTTP {status}: {said or 'refused'}")
    return ConnectionFailedError(url, str(exc) or type(exc).__name__)


async def _connect(url: str, **options: Any) -> ClientConnection:
    # Imported on first use: a server process imports this module (through an
    # environment package's client) but never opens a connection.
    from websockets.asyncio.client import connect

    return await connect(url, **options)
