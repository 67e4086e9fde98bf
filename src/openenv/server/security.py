"""Who may use a server: the API key, the host names it answers to, and which
web pages may open sessions.

A pure ASGI middleware, so it costs one check per HTTP request or WebSocket
handshake and nothing per frame. A rejected WebSocket handshake gets an HTTP
401/403 answer (or close code 1008 where the ASGI server cannot send one)
before any session, slot or environment exists.

The ``Host`` check stops DNS rebinding: a page on ``evil.example`` whose name
the attacker re-points at 127.0.0.1 reaches a local server with
``Host: evil.example``, and its own ``Origin`` then looks same-origin. Rebinding
always needs a host *name*, so localhost names and IP literals are always
allowed; other names must be listed in ``allowed_hosts``.

The key may come as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``
(programs; the latter is how OpenReward's SDK sends it), as a WebSocket
subprotocol ``openenv.key.KEY`` (browsers cannot set headers on WebSockets),
or as an ``api_key`` query parameter (a link to the web page).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from urllib.parse import unquote_plus, urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from openenv.server.redact import DENIED, redact_api_keys

__all__ = [
    "KEY_SUBPROTOCOL_PREFIX",
    "PUBLIC_PATHS",
    "AccessGuard",
    "AnyGuard",
    "HostAllowList",
    "host_name",
    "is_public",
    "route_path",
]

KEY_SUBPROTOCOL_PREFIX = "openenv.key."
# The web page's own files are public (a browser cannot attach a key to
# <script src>); what it loads from the server, and its sessions, are not.
PUBLIC_PATHS = frozenset({"/health", "/web"})
# A browser's Origin is checked wherever a page could act, not just read: on
# WebSockets, on every method but these (a foreign page may send a POST without
# asking, and only its answer is kept from it), and on /mcp whatever the method
# (its GET opens a session's event stream). OpenReward's routes check the same
# way through ``refusal`` (server/openreward.py).
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_ORIGIN_CHECKED_PATHS = frozenset({"/mcp"})
# Host values whose answer HostAllowList keeps; past this many it starts over.
_SEEN_HOSTS = 64


def is_public(path: str) -> bool:
    """``/health``, ``/web`` and the page's files: ``/web/NAME``, one segment deep.

    >>> [is_public(p) for p in ("/web", "/web/app.js", "/web/ws", "/web/x/tools")]
    [True, True, False, False]
    """
    if path in PUBLIC_PATHS:
        return True
    # Deeper paths are not the page's: OpenReward's /{env}/tools would match them.
    name = path[len("/web/") :]
    return path.startswith("/web/") and name != "ws" and "/" not in name


def host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port, lowercased.

    >>> host_name("Example.COM:8000"), host_name("[::1]:80"), host_name("127.0.0.1")
    ('example.com', '::1', '127.0.0.1')
    """
    host = host.strip().lower()
    if host.startswith("["):  # an IPv6 literal, with or without a port
        return host[1:].partition("]")[0]
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        host = name
    return host.rstrip(".")


class HostAllowList:
    """The host names a server answers to: localhost names, IP literals, and ``extra``.

    ``extra`` holds exact names, ``*.example.com`` for every subdomain, or
    ``*`` for any name (DNS rebinding protection off).

    >>> hosts = HostAllowList(["env.example.com", "*.internal"])
    >>> [hosts.allows(h) for h in ("localhost:8000", "10.0.0.7", "[::1]", "env.example.com")]
    [True, True, True, True]
    >>> [hosts.allows(h) for h in ("a.b.internal", "evil.example:8000", "internal")]
    [True, False, False]
    """

    def __init__(self, extra: Iterable[str] = ()) -> None:
        names = {host_name(h) for h in extra if h.strip()}
        self.any = "*" in names
        self._exact = frozenset(n for n in names if not n.startswith("*."))
        self._suffixes = tuple(n[1:] for n in names if n.startswith("*."))
        # Answers for the Host values seen lately: every connection asks, nearly
        # always with the same few values, and parsing an IP literal costs about
        # a twentieth of a WebSocket connect.
        self._seen: dict[str, bool] = {}

    def allows(self, host: str) -> bool:
        if self.any:
            return True
        known = self._seen.get(host)
        if known is None:
            known = self._allows(host)
            if len(self._seen) >= _SEEN_HOSTS:
                self._seen.clear()  # clients choose Host values: they must not grow it
            self._seen[host] = known
        return known

    def _allows(self, host: str) -> bool:
        name = host_name(host)
        if name == "localhost" or name.endswith(".localhost") or name in self._exact:
            return True
        if self._suffixes and name.endswith(self._suffixes):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True


class AccessGuard:
    """Check the ``Host`` on every request, the API key (when set) on every
    non-public route, and a trusted ``Origin`` on WebSockets, ``/mcp`` and every
    request that may act (any method but GET, HEAD and OPTIONS)."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        allowed_origins: tuple[str, ...] = (),
        allowed_hosts: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        redact_api_keys()  # a key passed as ?api_key= must not reach uvicorn's logs
        self._key = api_key.encode() if api_key else None
        self._origins = frozenset(o.rstrip("/").lower() for o in allowed_origins)
        self._hosts = HostAllowList(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope, route_path(scope))
        if refusal is not None:
            await _deny(scope, receive, send, *refusal)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope, path: str) -> tuple[int, str] | None:
        """Why this request may not reach ``path`` (a status and a message), or ``None``."""
        headers = Headers(scope=scope)
        host = headers.get("host")
        # No Host at all is an HTTP/1.0 program, never a browser.
        if host is not None and not self._hosts.allows(host):
            return 403, _host_refusal(host)
        if (
            scope["type"] == "websocket"
            or scope["method"] not in _SAFE_METHODS
            or path in _ORIGIN_CHECKED_PATHS
        ) and not self._origin_allowed(headers):
            return 403, f"origin {headers.get('origin')} may not open sessions"
        if self._key is not None and not is_public(path):
            supplied = _supplied_key(scope, headers)
            if supplied is None:
                return 401, "missing API key"
            if not hmac.compare_digest(supplied.encode(), self._key):
                return 401, "wrong API key"
        return None

    def _origin_allowed(self, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin is None or "*" in self._origins:
            return True  # not a browser, or every page is trusted
        origin = origin.rstrip("/").lower()
        if origin in self._origins:
            return True
        # Same origin: the page was served by this very host (an allowed one,
        # checked above, so not a rebound name).
        return urlsplit(origin).netloc == headers.get("host", "").lower()


class AnyGuard:
    """The root of a server of several environments (``create_multi_app``): a
    request gets through if the guard of one of them lets it.

    Its own routes (the listing, the API docs) belong to no one environment,
    so a key of any of them will do, and a host any of them answers to; with
    none set, none is needed. Paths under one of ``mounted`` (``/envs/NAME/``)
    go straight on, to that environment's own guard, which keeps their public
    routes public; other paths under ``/envs/`` are the root's.
    """

    def __init__(self, app: ASGIApp, guards: Iterable[AccessGuard], mounted: Iterable[str]) -> None:
        self.app = app
        self.guards = tuple(guards)
        self.mounted = tuple(mounted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not scope["path"].startswith(self.mounted):
            path = route_path(scope)
            refusals = [guard.refusal(scope, path) for guard in self.guards]
            if None not in refusals:
                # 401 before 403: one that refused only the key would take the right one.
                status, message = min(r for r in refusals if r is not None)
                await _deny(scope, receive, send, status, message)
                return
        await self.app(scope, receive, send)


def route_path(scope: Scope) -> str:
    """The path within this app: under a ``Mount`` (``/envs/{name}``) Starlette
    keeps the full path in ``path`` and the mount point in ``root_path``."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


def _host_refusal(host: str) -> str:
    name = host_name(host)[:100]
    return (
        f"host {name!r} is not allowed (DNS rebinding protection); to serve under this "
        f"name, pass allowed_hosts=({name!r},) to create_app or set "
        f"OPENENV_ALLOWED_HOSTS={name}"
    )


def _supplied_key(scope: Scope, headers: Headers) -> str | None:
    authorization = headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token:
        return str(token).strip()
    if key := headers.get("x-api-key", "").strip():  # OpenReward's SDK
        return key
    for protocol in scope.get("subprotocols", ()):
        if protocol.startswith(KEY_SUBPROTOCOL_PREFIX):
            return str(protocol[len(KEY_SUBPROTOCOL_PREFIX) :])
    query: str = scope.get("query_string", b"").decode("latin-1")
    # The name as sent, not decoded: uvicorn logs the raw query, and the log
    # filter masks only ``api_key=``; ``api%5Fkey=KEY`` would be logged whole.
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name == "api_key":
            return unquote_plus(value)
    return None


async def _deny(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
    response = JSONResponse(
        {"detail": message},
        status_code=status,
        headers={"WWW-Authenticate": "Bearer"} if status == 401 else None,
    )
    if scope["type"] == "http" or "websocket.http.response" in scope.get("extensions", {}):
        # Starlette turns the response into the WebSocket denial response itself.
        if scope["type"] == "websocket":
            DENIED.set(True)  # uvicorn would call this refusal an unfinished handshake
        await response(scope, receive, send)
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": message})
