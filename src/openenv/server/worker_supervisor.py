"""``serve(workers=N)``: processes sharing one socket and one session cap, replaced as they die."""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

from openenv.server.board_folders import new_board_folder
from openenv.server.exit_deadline import (
    EXIT_GRACE,
    exit_deadline,
    longest_shutdown,
    orphan_board,
    remove_orphaned_board,
)
from openenv.server.gc_tuning import DEFAULT_GC_THRESHOLD
from openenv.server.graceful_server import GracefulServer, uvicorn_config
from openenv.server.slots import BOARD_VAR, forget_worker

__all__ = ["supervise"]

logger = logging.getLogger("openenv.server")

_SHM = "/dev/shm"  # the board is a few KiB read on every admission: keep it in memory
_STARTUP_FAILURE = 3  # uvicorn's exit code when the app's startup fails
_CRASH_LOOP_SECONDS = 1.0


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
            started.send_bytes(str(longest_shutdown()).encode())
        started.close()

    server = GracefulServer(
        config, supervised=True, gc_threshold=gc_threshold, on_started=tell_started
    )
    _drain_when_orphaned(server)
    try:
        server.run(sockets=[sock])
    finally:
        remove_orphaned_board()


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
        multiprocessing.connection.wait([parent.sentinel])
        logger.warning("the supervisor is gone; worker %s stops", os.getpid())
        orphan_board(os.environ.get(BOARD_VAR))
        if server._exit_deadline is None:  # nobody else will stop it if the drain cannot
            server._exit_deadline = exit_deadline()
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


def supervise(
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
            limit = max([kill_after, *(t + 2 * EXIT_GRACE for t in apps if t is not None)])
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
