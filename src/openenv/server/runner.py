"""``serve``: run apps under uvicorn with heartbeats, frame limits and a graceful shutdown.

Plain ``uvicorn server.app:app`` works too; ``serve`` (and ``openenv serve``)
adds what uvicorn cannot know about sessions: on SIGTERM or SIGINT it stops
accepting, sends close code 1001 to every session, closes every environment
within ``shutdown_timeout`` and exits 0, where bare uvicorn closes sockets
with 1012 and re-raises the signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from openenv.server.board_folders import new_board_folder
from openenv.server.config import ServerSettings
from openenv.server.gc_tuning import DEFAULT_GC_THRESHOLD, tune_gc
from openenv.server.protocols import default_protocols
from openenv.server.service import LIVE_SERVICES
from openenv.server.slots import BOARD_VAR, forget_worker, remove_if_unused

__all__ = ["GracefulServer", "run_on_socket", "serve", "uvicorn_config"]

logger = logging.getLogger("openenv.server")

_SHM = "/dev/shm"  # the board is a few KiB read on every admission: keep it in memory
_STARTUP_FAILURE = 3  # uvicorn's exit code when the app's startup fails
_CRASH_LOOP_SECONDS = 1.0
_EXIT_GRACE = 10.0  # past shutdown_timeout: for aborts, lifespan and closes to finish
# For apps the supervisor has not seen: ServerSettings' own default.
_SHUTDOWN_TIMEOUT: float = ServerSettings.model_fields["shutdown_timeout"].default


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
            self._exit_deadline = _exit_deadline()
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


def _exit_deadline() -> threading.Timer:
    """End the process if a shutdown overruns ``shutdown_timeout`` by ``_EXIT_GRACE``.

    The drain keeps that deadline on the event loop, so an ``async def`` step
    that blocks the loop for good would hold the process (and under
    ``--workers`` its supervisor) for ever: only a thread can still act.
    """
    seconds = _longest_shutdown() + _EXIT_GRACE

    def expire() -> None:
        logger.error(
            "the shutdown overran its %gs deadline: the event loop is blocked (see the "
            "watchdog's warning) or a task would not end; exiting without it",
            seconds,
        )
        _remove_orphaned_board()
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def _longest_shutdown() -> float:
    """The longest ``shutdown_timeout`` of the apps this process serves."""
    return max((s.settings.shutdown_timeout for s in LIVE_SERVICES), default=_SHUTDOWN_TIMEOUT)


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
    started reports its app's own): a worker still running ``_EXIT_GRACE``
    twice past it after SIGTERM is killed.
    """
    if workers > 1:
        if not isinstance(app, str):
            raise ValueError("workers > 1 needs the app as an import string, e.g. 'server.app:app'")
        kill_after = (shutdown_timeout or _SHUTDOWN_TIMEOUT) + 2 * _EXIT_GRACE
        options = {**options, "gc_threshold": gc_threshold}
        _supervise(workers, app, app_dir, sock, options, kill_after)
        return
    config = uvicorn_config(app, **options)
    server = GracefulServer(config, gc_threshold=gc_threshold)
    if config.should_reload:
        from uvicorn.supervisors import ChangeReload

        ChangeReload(config, target=server.run, sockets=[sock]).run()
    else:
        server.run(sockets=[sock])


def _worker(
    app: str,
    app_dir: str | Path | None,
    sock: socket.socket,
    options: dict[str, Any],
    started: multiprocessing.connection.Connection,
) -> None:
    if app_dir is not None:
        sys.path.insert(0, str(app_dir))
    options = dict(options)
    gc_threshold = options.pop("gc_threshold", DEFAULT_GC_THRESHOLD)
    config = uvicorn_config(app, **options)

    def tell_started() -> None:
        # The app's shutdown_timeout: the supervisor (given an import string) cannot know it.
        with contextlib.suppress(OSError):  # the supervisor is gone: nobody to tell
            started.send_bytes(str(_longest_shutdown()).encode())
        started.close()

    server = GracefulServer(
        config, supervised=True, gc_threshold=gc_threshold, on_started=tell_started
    )
    _drain_when_orphaned(server)
    try:
        server.run(sockets=[sock])
    finally:
        _remove_orphaned_board()


# Set in a worker whose supervisor is gone: the board it must not leave behind.
_orphaned_board: str | None = None


def _remove_orphaned_board() -> None:
    if _orphaned_board is not None and remove_if_unused(_orphaned_board):
        logger.info("removed the slot board %s its supervisor left", _orphaned_board)


def _drain_when_orphaned(server: GracefulServer) -> None:
    """Drain and stop ``server`` once the supervisor is gone, however it went.

    A supervisor killed with SIGKILL (or by a signal before its handlers were
    in place) cannot stop its workers: left alone they would serve on, holding
    the port, with nobody to replace them or to stop them. The parent's
    sentinel (a pipe multiprocessing keeps open in the parent) becomes ready
    when the parent dies.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        global _orphaned_board
        multiprocessing.connection.wait([parent.sentinel])
        logger.warning("the supervisor is gone; worker %s stops", os.getpid())
        _orphaned_board = os.environ.get(BOARD_VAR)
        if server._exit_deadline is None:  # nobody else will stop it if the drain cannot
            server._exit_deadline = _exit_deadline()
        server.should_exit = True

    threading.Thread(target=watch, name="openenv-orphan-watch", daemon=True).start()


def _end_of(process: multiprocessing.process.BaseProcess) -> Any:
    """What becomes ready when ``process`` ends: a pidfd where the kernel has them.

    A process's sentinel is a pipe it holds open, and so does every child it
    forks without exec (a multiprocessing pool in environment code, say): the
    worker's death would go unseen, and it unreplaced, for as long as they live.
    """
    pid_open = getattr(os, "pidfd_open", None)
    if pid_open is not None and process.pid is not None:
        with contextlib.suppress(OSError):
            fd: int = pid_open(process.pid)
            return fd
    return process.sentinel


def _supervise(
    workers: int,
    app: str,
    app_dir: str | Path | None,
    sock: socket.socket,
    options: dict[str, Any],
    kill_after: float,
) -> None:
    """Run ``workers`` processes on one socket sharing one session cap; replace any that dies.

    uvicorn's own ``Multiprocess`` supervisor would replace workers too, but it
    runs a plain ``uvicorn.Server`` in each, without openenv's drain; this loop
    waits on each worker's end (``_end_of``), so a death is seen at once, not at the
    next health-check tick.
    """
    context = multiprocessing.get_context("spawn")
    board = new_board_folder(_SHM if os.path.isdir(_SHM) else tempfile.gettempdir())
    previous = os.environ.get(BOARD_VAR)
    os.environ[BOARD_VAR] = board  # spawned workers copy the environment as they start
    stopping = False

    # Whether each worker said it started (exit code 3 is uvicorn's for a
    # startup that failed, but environment code may exit with 3 later on too),
    # and the shutdown_timeout it said its app has.
    started: dict[multiprocessing.process.BaseProcess, multiprocessing.connection.Connection] = {}
    heard: dict[multiprocessing.process.BaseProcess, float] = {}

    def shutdown_timeout_of(process: multiprocessing.process.BaseProcess) -> float | None:
        said = started.get(process)
        # No wait: a child the worker forked may hold the pipe's other end open.
        if said is not None and said.poll():
            with contextlib.suppress(EOFError, OSError, ValueError):  # ended without a word
                heard[process] = float(said.recv_bytes())
            said.close()
            del started[process]
        return heard.get(process)

    def start() -> multiprocessing.process.BaseProcess:
        said, says = context.Pipe(duplex=False)
        # The socket itself travels to each child (multiprocessing duplicates it).
        process = context.Process(target=_worker, args=(app, app_dir, sock, options, says))
        try:
            process.start()
        except BaseException:
            said.close()
            raise
        finally:
            says.close()  # the worker's end now: its death closes it
        started[process] = said
        return process

    processes: list[multiprocessing.process.BaseProcess] = []
    born: dict[int | None, float] = {}

    signalled_at: float | None = None
    # The loop below may be waiting without a timeout when a signal sets one:
    # a byte down this pipe wakes it to start counting.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)

    def stop(sig: int, frame: object) -> None:
        nonlocal stopping, signalled_at
        stopping = True
        if signalled_at is None:
            signalled_at = time.monotonic()
            with contextlib.suppress(OSError):
                os.write(wake_w, b"\0")
        for process in processes:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    ends: dict[multiprocessing.process.BaseProcess, Any] = {}

    def add(process: multiprocessing.process.BaseProcess) -> None:
        ends[process] = _end_of(process)
        processes.append(process)
        born[process.pid] = time.monotonic()
        if stopping and process.pid is not None:
            # The signal came while it was being started, before ``stop`` could see it.
            os.kill(process.pid, signal.SIGTERM)

    # Handlers first: a signal between starting a worker and handling signals
    # would end this process by default and leave that worker serving on.
    originals = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    failed = False
    try:
        for _ in range(workers):
            if not stopping:
                add(start())
        while processes:
            # A worker that cannot take its signal (C code holding the GIL) or
            # keep its own deadline is killed past the supervisor's.
            apps = [shutdown_timeout_of(p) for p in processes]
            limit = max([kill_after, *(t + 2 * _EXIT_GRACE for t in apps if t is not None)])
            kill_at = None if signalled_at is None else signalled_at + limit
            left = None if kill_at is None else max(kill_at - time.monotonic(), 0.0)
            ended = multiprocessing.connection.wait([wake_r, *(ends[p] for p in processes)], left)
            if wake_r in ended:
                os.read(wake_r, 512)
            if stopping:  # no worker takes connections any more: refused, not held in its backlog
                sock.close()
            if kill_at is not None and time.monotonic() >= kill_at:
                for process in processes:
                    if process.pid is not None and process.is_alive():
                        logger.error(
                            "worker %s did not stop within %gs of the signal; killing it",
                            process.pid,
                            limit,
                        )
                        os.kill(process.pid, signal.SIGKILL)
                signalled_at = None  # once; another signal arms it again
            for process in [p for p in processes if ends[p] in ended]:
                process.join()
                processes.remove(process)
                if process.pid is not None:
                    forget_worker(board, process.pid)  # its slots, whoever holds its row lock
                if (end := ends.pop(process)) != process.sentinel:
                    os.close(end)  # a pidfd of ours
                ever_started = shutdown_timeout_of(process) is not None
                heard.pop(process, None)
                if (said := started.pop(process, None)) is not None:
                    said.close()
                if stopping:
                    continue
                if not ever_started and (process.exitcode or 0) >= 0:
                    # Exited, not killed, before serving (uvicorn's 3, an app that raises
                    # as it is imported): every replacement would too. The app is broken.
                    logger.error(
                        "worker %s exited with code %s before it served; stopping",
                        process.pid,
                        process.exitcode,
                    )
                    failed = True
                    stop(signal.SIGTERM, None)
                    continue
                logger.warning(
                    "worker %s exited with code %s; starting a replacement",
                    process.pid,
                    process.exitcode,
                )
                if time.monotonic() - born.pop(process.pid, 0.0) < _CRASH_LOOP_SECONDS:
                    time.sleep(_CRASH_LOOP_SECONDS)  # dying at once: do not spin
                if not stopping:
                    add(start())
    finally:
        for sig, handler in originals.items():
            signal.signal(sig, handler)
        for process in processes:  # only if this loop failed: stop what it started
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
            process.join()
        for process, end in ends.items():
            if end != process.sentinel:
                os.close(end)
        for said in started.values():
            said.close()
        os.close(wake_r)
        os.close(wake_w)
        sock.close()
        if previous is None:
            os.environ.pop(BOARD_VAR, None)
        else:
            os.environ[BOARD_VAR] = previous
        shutil.rmtree(board, ignore_errors=True)
    if failed:
        raise SystemExit(_STARTUP_FAILURE)
