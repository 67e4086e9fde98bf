"""A fleet's one address: the small server clients are given instead of a replica's.

``GET /replicas`` lists the replicas as the fleet last saw them and ``GET
/health`` sums them, answered here; ``/ws`` is redirected (307) to the replica
with the most room; every other ``GET`` (``/schema``, ``/tasks``, ``/tools``...)
is asked of a replica that is up and its answer passed back, and ``/web``
redirected to a replica's page. It runs in a thread of the process that started
the fleet.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import httpx

from openenv.protocol import ErrorCode
from openenv.server.redact import DENIED, redact_api_keys

if TYPE_CHECKING:
    from openenv.fleet import Fleet

__all__ = ["Directory"]

# What the directory passes on when a replica answers for it.
_PASSED_ON = frozenset({"authorization", "x-api-key", "accept"})
_PASSED_BACK = frozenset({"content-type", "cache-control", "www-authenticate"})


class Directory:
    """The fleet's one address, served from this process: ``/replicas`` and ``/health``
    answered here, ``/ws`` redirected (307) to the replica with the most room, and
    every other ``GET`` asked of a replica that is up."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._context: contextlib.ExitStack | None = None

    def start(self, host: str, port: int) -> str:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, RedirectResponse, Response
        from starlette.routing import Route, WebSocketRoute
        from starlette.websockets import WebSocket

        from openenv.server.security import AccessGuard

        fleet = self.fleet

        async def replicas(request: Request) -> JSONResponse:
            return JSONResponse({"replicas": [asdict(v) for v in fleet.views()]})

        async def session(websocket: WebSocket) -> None:
            # A plain client given the fleet's address: send it on to the replica
            # with the most room (WebSocket clients follow a 307 on the upgrade).
            DENIED.set(True)  # either way a refusal, which uvicorn would log as an error
            target = fleet.place()
            if target is None:
                # Full and down are told apart: one is worth waiting for, the other may not be.
                up = fleet.serving()
                if up:
                    # As a full server says it: clients raise CapacityError (retry later).
                    refusal = {
                        "detail": f"every replica of this fleet is full ({len(up)} up)",
                        "code": ErrorCode.CAPACITY_REACHED.value,
                        "active_sessions": sum(v.active_sessions for v in up),
                        "max_sessions": sum(v.max_sessions for v in up),
                    }
                else:
                    refusal = {"detail": "no replica of this fleet is up"}
                await websocket.send_denial_response(JSONResponse(refusal, 503))
                return
            # The query goes along, as for /web: a key may come as ?api_key=.
            query = f"?{websocket.url.query}" if websocket.url.query else ""
            await websocket.send_denial_response(
                RedirectResponse(target.replace("http", "ws", 1) + "/ws" + query, 307)
            )

        async def elsewhere(request: Request) -> Response:
            # The environment's other routes (/schema, /metadata, /splits, /tasks,
            # /tools...) say the same on every replica: ask one that is up. Read
            # here and passed on, not redirected: httpx and browsers drop the API
            # key on a redirect to another host. /metrics is one replica's own.
            path = request.url.path
            if path == "/metrics":
                detail = "each replica has its own /metrics: scrape the URLs /replicas lists"
                return JSONResponse({"detail": detail}, 404)
            views = fleet.serving()
            random.shuffle(views)
            views.sort(key=lambda v: v.status != "healthy")  # healthy first; sort is stable
            query = f"?{request.url.query}" if request.url.query else ""
            if path in ("/web", "/web/") and views:
                # The page plays over its own server's /web/ws, and browsers do not
                # follow a redirect on a WebSocket handshake: send the page itself.
                # "/web/" too: passed on, the replica's redirect to its own /web
                # would come back without its Location, a blank page.
                return RedirectResponse(views[0].url + "/web" + query, 307)
            passed = {k: v for k, v in request.headers.items() if k in _PASSED_ON}
            async with httpx.AsyncClient(timeout=30.0) as http:
                for view in views:
                    try:
                        answer = await http.get(view.url + path + query, headers=passed)
                    except httpx.HTTPError:
                        continue  # gone since the last look: the next one
                    kept = {k: v for k, v in answer.headers.items() if k in _PASSED_BACK}
                    return Response(answer.content, answer.status_code, headers=kept)
            return JSONResponse({"detail": "no replica of this fleet is up"}, 503)

        async def health(request: Request) -> JSONResponse:
            views = fleet.serving()
            status = views[0].status if views else "down"  # healthy if any replica is
            return JSONResponse(
                {
                    "status": status,
                    "active_sessions": sum(v.active_sessions for v in views),
                    "max_sessions": sum(v.max_sessions for v in views),
                    "queued_sessions": sum(v.queued_sessions for v in views),
                    "replicas": len(views),
                }
            )

        routes = [
            Route("/replicas", replicas),
            Route("/health", health),
            WebSocketRoute("/ws", session),
            Route("/{path:path}", elsewhere, methods=["GET", "HEAD"]),
        ]
        # The Host (and a browser's Origin) checked as a replica checks them
        # (security.md): the directory asks replicas by address, so a request
        # under a rebound name would otherwise reach them as an allowed one.
        # No key here: each replica checks the one passed on.
        app = AccessGuard(
            Starlette(routes=routes),
            api_key=None,
            allowed_origins=_setting(fleet.environ, "OPENENV_ALLOWED_ORIGINS"),
            allowed_hosts=_setting(fleet.environ, "OPENENV_ALLOWED_HOSTS"),
        )
        redact_api_keys()  # keys in query strings (a /web link) stay out of the logs
        self._context = contextlib.ExitStack()
        return self._context.enter_context(_serve_in_thread(app, host, port))

    def stop(self) -> None:
        if self._context is not None:
            self._context.close()


def _setting(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated setting as the replicas get it: the fleet's ``environ``,
    else this process's environment."""
    value = environ.get(name, os.environ.get(name, ""))
    return tuple(item.strip() for item in value.split(",") if item.strip())


@contextlib.contextmanager
def _serve_in_thread(app: Any, host: str, port: int) -> Iterator[str]:
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="openenv-directory", daemon=True
    )
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the fleet's directory failed to start")
            thread.join(0.01)
        name = f"[{host}]" if ":" in host else host
        yield f"http://{name}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
