"""Runner-side recording: every episode ``Runners`` plays, step by step, as JSON Lines.

``RunConfig(record="runs/today")`` (or ``openenv run --record runs/today``)
writes one file per run in each process that plays episodes
(``runner-<pid>-<start>.jsonl``: the driver in process, each worker process,
Ray actor or Spark worker). Each episode's lines are written together the
moment the episode ends, and are on disk within a quarter of a second (and
when the run ends), so a killed run loses at most its last moments.

The lines are the server's recording format (``openenv.server.recording``),
so ``openenv.trajectories.load`` reads both alike:

- ``{"session": S, "event": "opened", "at": T, "task": ID}``
- ``{"session": S, "event": "call", "started": T0, "ended": T1,
  "request": {"type": "step", "data": ...}, "reply": {"type": "observation", "data": ...}}``
  for every ``reset``, ``step``, ``state``, ``list_tools``, ``call_tool`` and
  ``get_prompt``: the request's data and the reply frame exactly as they crossed
  the wire (or the in-process session), error replies included
- ``{"session": S, "event": "closed", "at": T, "task": ID, "reason": R}``, where
  ``R`` is ``ok`` or the exception that ended the attempt (``TimeoutError``
  when the task ran out of time)

``S`` is the task's id; a retried attempt is ``ID/attempt-N`` and a
``ParallelizableAgent``'s sub-episode ``ID/fork-K``.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from openenv.trajectories import embedded_frame

__all__ = ["EpisodeRecord", "check_folder", "ended_by", "flush"]


class EpisodeRecord:
    """One session's events, kept until its episode ends, then written at once."""

    def __init__(self, folder: str, session: str, task_id: str) -> None:
        self.folder = folder
        self.session = session
        self.task_id = task_id
        self.forks = 0
        self.opened = time.time()
        # (request frame, reply frame, started, ended) per request, formatted at close:
        # this runs for every request, so it only keeps what crossed the wire.
        self._calls: list[tuple[str, str | bytes, float, float]] = []

    def call(self, request: str, reply: str | bytes, started: float) -> None:
        """One request frame and its reply frame, embedded as they crossed the wire."""
        self._calls.append((request, reply, started, time.time()))

    def fork(self) -> EpisodeRecord:
        """The record of a sub-episode played beside this one."""
        self.forks += 1
        return EpisodeRecord(self.folder, f"{self.session}/fork-{self.forks}", self.task_id)

    def close(self, reason: str) -> None:
        """The episode is over: write its lines to this process's file."""
        session, task = self.session, self.task_id
        lines = [_line({"session": session, "event": "opened", "at": self.opened, "task": task})]
        for request, reply, started, ended in self._calls:
            event = {
                "session": session,
                "event": "call",
                "started": started,
                "ended": ended,
                "request": orjson.Fragment(request),  # our own client's frame: one line of JSON
                # The server's, checked: one that pretty-prints, or lies, must not
                # split this line or break it.
                "reply": embedded_frame(reply),
            }
            lines.append(_line(event))
        closed = {"session": session, "event": "closed", "at": time.time(), "task": task}
        lines.append(_line({**closed, "reason": reason}))
        self._calls = []
        _writer(self.folder).write(b"".join(lines))


def ended_by(exc: BaseException) -> str:
    """The ``reason`` of an episode that ``exc`` ended: a cancellation is the deadline."""
    return "TimeoutError" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__


def _line(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event, default=repr, option=orjson.OPT_APPEND_NEWLINE)


class _Writer:
    """This process's recording file in one folder; episodes are appended whole.

    Flushed ``FLUSH_EVERY`` seconds after the first episode written since the
    last flush (a flush per episode would cost a system call each), and
    closed at the end of every run: the next run's episodes go to a new file,
    in the folder that has that name then (the last one may have been moved
    or deleted since).
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.path: Path | None = None  # the file being written, once there is one
        self._file: BinaryIO | None = None
        self._lock = threading.Lock()
        self._due = False  # a flush is scheduled

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._file is None:
                self._file = self._open()
            self._file.write(data)
            if self._due:
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._flush()
                return
            self._due = True
            loop.call_later(FLUSH_EVERY, self.flush)

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def close(self) -> None:
        with self._lock:
            self._due = False
            file, self._file = self._file, None
            if file is not None:
                file.close()

    def _open(self) -> BinaryIO:
        root = Path(self.folder)
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"runner-{os.getpid()}-{time.time_ns()}.jsonl"
        return self.path.open("ab", buffering=1 << 16)

    def _flush(self) -> None:
        self._due = False
        if self._file is not None:
            self._file.flush()


# Seconds an episode may wait in the buffer before it is on disk.
FLUSH_EVERY = 0.25

_writers: dict[tuple[int, str], _Writer] = {}
_writers_lock = threading.Lock()


def _writer(folder: str) -> _Writer:
    # Keyed by pid too: a forked process must not append to its parent's file.
    key = (os.getpid(), folder)
    writer = _writers.get(key)  # the common case, without the lock
    if writer is not None:
        return writer
    with _writers_lock:
        if key not in _writers:
            _writers[key] = _Writer(folder)
        return _writers[key]


@atexit.register
def _close() -> None:
    with _writers_lock:
        writers = [w for (pid, _), w in _writers.items() if pid == os.getpid()]
    for writer in writers:
        writer.close()


def check_folder(folder: str) -> None:
    """Make ``folder`` if need be, and check a file can be written there.

    Called before a run's first episode: a folder that cannot take the
    recording fails the run at once, not every episode once it has been played.

    Raises:
        ValueError: ``folder`` is a file, or cannot be made or written to.
    """
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ValueError(f"cannot record into {folder}: {exc.strerror or exc}") from None


def flush() -> None:
    """Put every episode recorded in this process so far on disk (the end of a run).

    The files are closed too: an episode recorded later (the next run) starts a
    new file in the folder as it is then.
    """
    _close()
