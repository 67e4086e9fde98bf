"""``serve``: run apps under uvicorn with heartbeats, frame limits and a graceful shutdown.

Plain ``uvicorn server.app:app`` works too; ``serve`` (and ``openenv serve``)
adds what uvicorn cannot know about sessions: on SIGTERM or SIGINT it stops
accepting, sends close code 1001 to every session, closes every environment
within ``shutdown_timeout`` and exits 0, where bare uvicorn closes sockets
with 1012 and re-raises the signal.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

from openenv.server.exit_deadline import EXIT_GRACE, SHUTDOWN_TIMEOUT
from openenv.server.gc_tuning import DEFAULT_GC_THRESHOLD
from openenv.server.graceful_server import GracefulServer, uvicorn_config
from openenv.server.worker_supervisor import supervise

__all__ = ["GracefulServer", "run_on_socket", "serve", "uvicorn_config"]


def serve(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    app_dir: str | Path | None = None,
    fd: int | None = None,
    gc_threshold: int | None = DEFAULT_GC_THRESHOLD,
    **options: Any,
) -> None:
    """Serve an ASGI app (or a ``"module:attribute"`` string) until SIGTERM/SIGINT.

    Args:
        app: The app, or its import string (required for ``reload``/``workers``).
        host: Interface to bind.
        port: Port to bind.
        workers: Processes sharing the listening socket and one session cap; a
            worker that dies is replaced. A WebSocket stays in the process
            that accepted it.
        app_dir: Folder to import the app string from (like ``uvicorn --app-dir``).
        fd: Serve on an already-bound socket descriptor instead of host/port.
        gc_threshold: Tune the garbage collector for serving (see
            ``openenv.server.gc_tuning``); ``None`` leaves it alone.
        **options: ``uvicorn_config`` options (``heartbeat_interval``, ...) and
            other ``uvicorn.Config`` options (``reload``, ``log_level``, ...).
    """
    if app_dir is not None:
        sys.path.insert(0, str(app_dir))
    config = uvicorn_config(app, host=host, port=port, fd=fd, **options)
    if workers > 1 or config.should_reload:
        run_on_socket(
            app,
            config.bind_socket(),
            workers=workers,
            app_dir=app_dir,
            gc_threshold=gc_threshold,
            **options,
        )
    else:
        GracefulServer(config, gc_threshold=gc_threshold).run()


def run_on_socket(
    app: Any,
    sock: socket.socket,
    *,
    workers: int = 1,
    app_dir: str | Path | None = None,
    gc_threshold: int | None = DEFAULT_GC_THRESHOLD,
    shutdown_timeout: float | None = None,
    **options: Any,
) -> None:
    """Serve on a socket the caller bound and listens on (``openenv serve`` does).

    ``workers > 1`` runs that many processes sharing one session cap, and
    replaces any that dies; ``reload=True`` restarts the app when its files change.
    ``shutdown_timeout`` is the app's (default: openenv's, 10 s; a worker that
    started reports its app's own): a worker still running ``EXIT_GRACE``
    twice past it after SIGTERM is killed.
    """
    if workers > 1:
        if not isinstance(app, str):
            raise ValueError("workers > 1 needs the app as an import string, e.g. 'server.app:app'")
        kill_after = (shutdown_timeout or SHUTDOWN_TIMEOUT) + 2 * EXIT_GRACE
        options = {**options, "gc_threshold": gc_threshold}
        supervise(workers, app, app_dir, sock, options, kill_after)
        return
    config = uvicorn_config(app, **options)
    server = GracefulServer(config, gc_threshold=gc_threshold)
    if config.should_reload:
        from uvicorn.supervisors import ChangeReload

        ChangeReload(config, target=server.run, sockets=[sock]).run()
    else:
        server.run(sockets=[sock])
