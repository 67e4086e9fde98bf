"""Runner-side recording: every episode ``Runners`` plays, step by step, as JSON Lines.

``RunConfig(record="runs/today")`` (or ``openenv run --record runs/today``)
writes one file per process that plays episodes (``runner-<pid>-<start>.jsonl``:
the driver in process, each worker process, Ray actor or Spark worker). Each
episode's lines are written together the moment the episode ends, and are
on disk within a quarter of a second (and when the run ends), so a killed
run loses at most its last moments.

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
import threading
import time
from pathlib import Path
from typing import Any

import orjson

__all__ = ["EpisodeRecord", "flush"]


class EpisodeRecord:
    """One session's events, kept until its episode ends, then written at once."""

    def __init__(self, folder: str, session: str, task_id: str) -> None:
        self.folder = folder
        self.session = session
        self.task_id = task_id
        self.forks = 0
        self._call_prefix = b'{"session":' + orjson.dumps(session) + b',"event":"call","started":'
        self._lines = [
            _line({"session": session, "event": "opened", "at": time.time(), "task": task_id})
        ]

    def call(self, request: str, reply: str | bytes, started: float) -> None:
        """One request frame and its reply frame, embedded as they crossed the wire."""
        # Put together by hand, frames as they are: this runs for every request.
        frame = reply.encode() if isinstance(reply, str) else reply
        if not (frame[:1] == b"{" and frame[-1:] == b"}"):  # not a JSON object: keep it as text
            frame = orjson.dumps({"invalid_frame": repr(frame[:200])})
        self._lines.append(
            b"".join(
                (
                    self._call_prefix,
                    repr(started).encode(),
                    b',"ended":',
                    repr(time.time()).encode(),
                    b',"request":',
                    request.encode(),
                    b',"reply":',
                    frame,
                    b"}\n",
                )
            )
        )

    def fork(self) -> EpisodeRecord:
        """The record of a sub-episode played beside this one."""
        self.forks += 1
        return EpisodeRecord(self.folder, f"{self.session}/fork-{self.forks}", self.task_id)

    def close(self, reason: str) -> None:
        """The episode is over: write its lines to this process's file."""
        event = {
            "session": self.session,
            "event": "closed",
            "at": time.time(),
            "task": self.task_id,
            "reason": reason,
        }
        self._lines.append(_line(event))
        _writer(self.folder).write(b"".join(self._lines))
        self._lines = []


def _line(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event, default=repr, option=orjson.OPT_APPEND_NEWLINE)


class _Writer:
    """This process's recording file in one folder; episodes are appended whole.

    Flushed ``FLUSH_EVERY`` seconds after the first episode written since the
    last flush, and at the end of every run: a flush per episode would cost a
    system call each.
    """

    def __init__(self, folder: str) -> None:
        root = Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"runner-{os.getpid()}-{time.time_ns()}.jsonl"
        self._file = self.path.open("ab", buffering=1 << 16)
        self._lock = threading.Lock()
        self._due = False  # a flush is scheduled

    def write(self, data: bytes) -> None:
        with self._lock:
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
            self._file.close()

    def _flush(self) -> None:
        self._due = False
        if not self._file.closed:
            self._file.flush()


# Seconds an episode may wait in the buffer before it is on disk.
FLUSH_EVERY = 0.25

_writers: dict[tuple[int, str], _Writer] = {}
_writers_lock = threading.Lock()


def _writer(folder: str) -> _Writer:
    # Keyed by pid too: a forked process must not append to its parent's file.
    key = (os.getpid(), folder)
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


def flush() -> None:
    """Put every episode recorded in this process so far on disk (the end of a run)."""
    with _writers_lock:
        writers = [w for (pid, _), w in _writers.items() if pid == os.getpid()]
    for writer in writers:
        writer.flush()
