"""The uvicorn server openenv runs, and its config: heartbeats, frame limits, a drain.

``GracefulServer`` drains openenv's sessions (close 1001, environments
closed within ``shutdown_timeout``) before uvicorn's own shutdown, where bare
uvicorn closes sockets with 1012 and waits for every task.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

from openenv.server.exit_deadline import exit_deadline
from openenv.server.gc_tuning import DEFAULT_GC_THRESHOLD, tune_gc
from openenv.server.protocols import default_protocols
from openenv.server.service import LIVE_SERVICES

__all__ = ["GracefulServer", "uvicorn_config"]


def uvicorn_config(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    heartbeat_interval: float | None = 20.0,
    heartbeat_timeout: float | None = 20.0,
    max_message_size: int = 2**20,
    log_level: str = "info",
    ws: Any = None,
    http: Any = None,
    **options: Any,
) -> uvicorn.Config:
    """A ``uvicorn.Config`` with openenv's WebSocket defaults.

    The server pings every session every ``heartbeat_interval`` seconds and
    drops it when no pong arrives within ``heartbeat_timeout``: that is how a
    half-open client (gone without a close) loses its slot. Frames larger than
    ``max_message_size`` are refused by the WebSocket layer with close 1009
    before they are buffered. ``ws`` is openenv's WebSocket protocol
    (``server/wsprotocol.py``), uvicorn's with a fast path for small frames;
    the HTTP protocol drops connections that do not finish a request's headers
    in time (``server/httpprotocol.py``). Both are used only with the uvicorn and
    websockets releases they were tested with (``server/protocols.py``); with
    others, ``None`` for ``ws``/``http`` means uvicorn's own, and a warning.
    """
    if ws is None or http is None:
        fast_ws, fast_http = default_protocols()
        ws = fast_ws if ws is None else ws
        http = fast_http if http is None else http
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ws_ping_interval=heartbeat_interval,
        ws_ping_timeout=heartbeat_timeout,
        ws_max_size=max_message_size,
        log_level=log_level,
        ws=ws,
        http=http,
        lifespan="on",
        **options,
    )


class GracefulServer(uvicorn.Server):
    """A uvicorn server that drains openenv sessions before it stops.

    A worker of ``serve(workers=N)`` is ``supervised``: a terminal's Ctrl+C
    reaches it twice (from the terminal, and as the supervisor's SIGTERM),
    which must not turn the drain into uvicorn's forced exit. ``on_started``
    is called once the app has started and the server listens.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        supervised: bool = False,
        gc_threshold: int | None = DEFAULT_GC_THRESHOLD,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.supervised = supervised
        self.gc_threshold = gc_threshold
        self.on_started = on_started
        self._restore_gc: Callable[[], None] | None = None
        self._exit_deadline: threading.Timer | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # a failed startup exits (code 3) from in there
        # Once the app and its lifespan are up, so that what they made is frozen.
        self._restore_gc = tune_gc(self.gc_threshold)
        if self.on_started is not None:
            self.on_started()

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            super().run(sockets)
        finally:
            if self._exit_deadline is not None:
                self._exit_deadline.cancel()  # stopped in time: the caller may go on

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._exit_deadline is None:
            self._exit_deadline = exit_deadline()
        if self.supervised:
            self.should_exit = True
            return
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises a captured SIGTERM after shutting down, which ends
        # the process with status 143; a drained server has nothing left to
        # report, so it restores the handlers and exits 0.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._restore_gc is not None:
            self._restore_gc()
            self._restore_gc = None
        for server in self.servers:
            server.close()  # stop accepting before draining
        # Only this server's: another server of the process (a thread with a
        # loop of its own) goes on serving.
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(service.drain() for service in list(LIVE_SERVICES) if loop in service.loops)
        )
        await super().shutdown(sockets)
