"""Helpers for testing environments against a real server.

>>> from openenv.testing import run_server
>>> from echo_env.server.app import app
>>> from echo_env import EchoAction, EchoEnv
>>> with run_server(app) as url, EchoEnv(url).sync() as env:
...     _ = env.reset()
...     env.step(EchoAction(message="hi")).observation.echoed_message
'hi'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

from openenv.server.service import LIVE_SERVICES, EnvService

logger = logging.getLogger("openenv.server")

__all__ = ["run_server"]

_NO_APP_DEADLINE = 30.0  # an app that is not openenv's has no shutdown_timeout to go by
_GRACE = 10.0  # past the deadline: for the aborts and the lifespan to finish


class _BoundedServer(uvicorn.Server):
    """uvicorn's server, whose shutdown keeps the served apps' ``shutdown_timeout``.

    Plain uvicorn waits for every connection's task with no deadline, so one
    session whose blocking ``def`` step never returns would hold the shutdown
    for ever. Past the deadline the connections left are aborted, as
    ``openenv serve`` aborts them: the environment still running on its
    thread is abandoned without ``close()``.
    """

    deadline: float | None = None
    _services: list[EnvService]

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        loop = asyncio.get_running_loop()
        # Known once the lifespan has started: the apps served on this loop.
        self._services = [s for s in LIVE_SERVICES if loop in s.loops]
        self.deadline = max((s.settings.shutdown_timeout for s in self._services), default=None)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.deadline is None:
            await super().shutdown(sockets)
            return
        late = asyncio.get_running_loop().call_later(self.deadline, self._abort_the_rest)
        # Sessions driven over HTTP (OpenEnv's /mcp, OpenReward) end now, as under
        # ``openenv serve``: uvicorn waits for their calls' open responses, and
        # only their drain answers a call past the deadline.
        hooks = [hook() for service in self._services for hook in service.drain_hooks]
        try:
            await asyncio.gather(super().shutdown(sockets), *hooks)
        finally:
            late.cancel()

    def _abort_the_rest(self) -> None:
        loop = asyncio.get_running_loop()
        for service in self._services:
            left = [c for c in list(service.connections) if c.closed.get_loop() is loop]
            if left:
                logger.error(
                    "%d session(s) still open after %ss; aborting them", len(left), self.deadline
                )
            for connection in left:
                connection.abort()


@contextlib.contextmanager
def run_server(app: Any, host: str = "127.0.0.1", **config: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a background thread; yield its base URL.

    The port is chosen by the OS and bound before uvicorn starts, so there is
    no race for it, and the URL is handed out only once the app has started.
    On exit the server shuts down (closing every open session with 1012, as
    uvicorn does) and the thread is joined. A session whose call is still
    running ``shutdown_timeout`` seconds after that (a blocking ``def`` step
    that never returns) is aborted and its environment left on its thread
    without ``close()``; that thread is a daemon, so it does not hold the
    interpreter's exit. Sessions driven over HTTP (OpenEnv's ``/mcp``
    sessions, OpenReward's) end as the shutdown begins, as under ``openenv
    serve``; a tool call of theirs still running at the deadline is answered
    ``SESSION_ERROR``. If the server has still not stopped 10 s later, exit
    raises ``RuntimeError`` (this process is never ended from here).
    ``config`` goes to ``uvicorn.Config``; the WebSocket and HTTP protocols are
    openenv's own, as ``openenv serve`` runs them, unless ``ws`` or ``http``
    says otherwise.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config.setdefault("log_level", "warning")
    config.setdefault("ws", "openenv.server.wsprotocol:WebSocketProtocol")
    config.setdefault("http", "openenv.server.httpprotocol:HttpToolsProtocol")
    server = _BoundedServer(uvicorn.Config(app, lifespan="on", **config))

    def run() -> None:
        # uvicorn ends a failed startup with sys.exit(3): in this thread, the
        # caller hears of it below, not as an exception of a stray thread.
        with contextlib.suppress(SystemExit):
            server.run(sockets=[sock])

    thread = threading.Thread(target=run, name="openenv-test-server", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn exited during startup; see the log above")
            thread.join(0.01)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        deadline = server.deadline
        waited = _NO_APP_DEADLINE if deadline is None else deadline + _GRACE
        thread.join(waited)
        sock.close()
        if thread.is_alive():
            raise RuntimeError(f"uvicorn did not shut down within {waited:g} s")
