"""One replica of a fleet: an openenv server inside a Ray actor, and the fleet's view of it."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SERVING", "Replica", "ReplicaView", "load_problem"]

# The statuses of a replica that takes sessions, in the order they are chosen.
SERVING = ("healthy", "degraded")


@dataclass
class ReplicaView:
    """A replica as the directory last saw it."""

    url: str
    status: str = "starting"  # healthy, draining, down, starting
    active_sessions: int = 0
    max_sessions: int = 0
    queued_sessions: int = 0
    node: str = ""
    pid: int = 0


class Replica:
    """One openenv server in a Ray actor's process (``Fleet`` makes the actor class)."""

    def __init__(self, folder: str, environ: Mapping[str, str], host: str | None) -> None:
        import ray

        from openenv.cli.app_loader import imported_app
        from openenv.server.runner import GracefulServer, uvicorn_config

        self._stack = contextlib.ExitStack()
        app = self._stack.enter_context(imported_app(folder, dict(environ)))
        host = host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        self._sock = sock
        self._server = GracefulServer(uvicorn_config(app, log_level="warning"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server of {folder} failed to start; see its log")
            self._thread.join(0.01)
        name = f"[{host}]" if ":" in host else host
        self._url = f"http://{name}:{sock.getsockname()[1]}"
        self._node = ray.get_runtime_context().get_node_id()

    def where(self) -> dict[str, Any]:
        """Its URL, node and process."""
        return {"url": self._url, "node": self._node, "pid": os.getpid()}

    def stop(self) -> None:
        """Drain (close 1001 to every session) and stop serving."""
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()


def load_problem(folder: str, environ: Mapping[str, str]) -> str | None:
    """Why a replica could not import the folder's app (one line), or ``None``."""
    from openenv.cli.app_loader import AppLoadError, imported_app

    try:
        with imported_app(folder, dict(environ)):
            return None
    except AppLoadError as exc:
        return str(exc)
