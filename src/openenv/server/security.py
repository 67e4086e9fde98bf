"""Who may use a server: the API key, and which web pages may open sessions.

A pure ASGI middleware, so it costs one check per HTTP request or WebSocket
handshake and nothing per frame. A rejected WebSocket handshake gets an HTTP
401/403 answer (or close code 1008 where the ASGI server cannot send one)
before any session, slot or environment exists.

The key may come as ``Authorization: Bearer KEY`` (programs), as a WebSocket
subprotocol ``openenv.key.KEY`` (browsers cannot set headers on WebSockets),
or as an ``api_key`` query parameter (a link to the web page).
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["KEY_SUBPROTOCOL_PREFIX", "PUBLIC_PATHS", "AccessGuard", "is_public"]

KEY_SUBPROTOCOL_PREFIX = "openenv.key."
# The web page's own files are public (a browser cannot attach a key to
# <script src>); what it loads from the server, and its sessions, are not.
PUBLIC_PATHS = frozenset({"/health", "/web"})


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or (path.startswith("/web/") and path != "/web/ws")


class AccessGuard:
    """Require the API key (when set) and a trusted ``Origin`` on WebSockets."""

    def __init__(
        self, app: ASGIApp, api_key: str | None, allowed_origins: tuple[str, ...] = ()
    ) -> None:
        self.app = app
        self._key = api_key.encode() if api_key else None
        self._origins = frozenset(o.rstrip("/").lower() for o in allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if scope["type"] == "websocket" and not self._origin_allowed(headers):
            origin = headers.get("origin")
            await _deny(scope, receive, send, 403, f"origin {origin} may not open sessions")
            return
        if self._key is not None and not is_public(scope["path"]):
            supplied = _supplied_key(scope, headers)
            if supplied is None:
                await _deny(scope, receive, send, 401, "missing API key")
                return
            if not hmac.compare_digest(supplied.encode(), self._key):
                await _deny(scope, receive, send, 401, "wrong API key")
                return
        await self.app(scope, receive, send)

    def _origin_allowed(self, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin is None or "*" in self._origins:
            return True  # not a browser, or every page is trusted
        origin = origin.rstrip("/").lower()
        if origin in self._origins:
            return True
        # Same origin: the page was served by this very host.
        return urlsplit(origin).netloc == headers.get("host", "").lower()


def _supplied_key(scope: Scope, headers: Headers) -> str | None:
    authorization = headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token:
        return str(token).strip()
    for protocol in scope.get("subprotocols", ()):
        if protocol.startswith(KEY_SUBPROTOCOL_PREFIX):
            return str(protocol[len(KEY_SUBPROTOCOL_PREFIX) :])
    query: str = scope.get("query_string", b"").decode("latin-1")
    for name, value in parse_qsl(query):
        if name == "api_key":
            return value
    return None


async def _deny(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
    response = JSONResponse(
        {"detail": message},
        status_code=status,
        headers={"WWW-Authenticate": "Bearer"} if status == 401 else None,
    )
    if scope["type"] == "http" or "websocket.http.response" in scope.get("extensions", {}):
        # Starlette turns the response into the WebSocket denial response itself.
        await response(scope, receive, send)
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": message})
