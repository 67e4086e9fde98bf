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

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["run_server"]


@contextlib.contextmanager
def run_server(app: Any, host: str = "127.0.0.1", **config: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a background thread; yield its base URL.

        The port is chosen by the OS and bound before uvicorn starts, so there is
        no race for it, and the URL is handed out only once the app has started.
        On exit the server shuts down (closing every open session) and the thread
        is joined. ``config`` goes to ``uvicorn.Config``; the WebSocket and HTTP
    protocols are openenv's own, as ``openenv serve`` runs them, unless ``ws`` or
    ``http`` says otherwise.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config.setdefault("log_level", "warning")
    config.setdefault("ws", "openenv.server.wsprotocol:WebSocketProtocol")
    config.setdefault("http", "openenv.server.httpprotocol:HttpToolsProtocol")
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", **config))

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
        thread.join(30)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("uvicorn did not shut down within 30 s")
