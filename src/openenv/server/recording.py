"""Server-side recording: every session's requests and replies, as JSON Lines.

``create_app(..., record="runs/today")`` writes one file per server process
into that folder (``sessions-<pid>-<start>.jsonl``); each line is one event of
one session, in the order the session saw them:

- ``{"session": ID, "event": "opened", "at": T}``
- ``{"session": ID, "event": "call", "started": T0, "ended": T1, "request": {...},
  "reply": {...}}``: a frame and its answer exactly as they crossed the wire
  (a frame whose JSON spans lines is put on one; a tool call from an MCP
  client is recorded as the ``call_tool`` frame it would have been)
- ``{"session": ID, "event": "closed", "at": T, "reason": "disconnect"}``

The web page's own reads of its session (``endpoint.PAGE_READS``) are left out.

Frames are embedded as they are, not decoded and encoded again, and lines go
through a 64 KiB buffer, so recording costs a few microseconds per step.
``openenv.trajectories`` reads the files back as episodes, replays them
against a server and turns them into tables.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from openenv.trajectories import embedded_frame

__all__ = ["Recorder"]

logger = logging.getLogger("openenv.server")


class Recorder:
    """Appends session events to this process's recording file."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"sessions-{os.getpid()}-{time.time_ns()}.jsonl"
        self._file = self.path.open("ab", buffering=1 << 16)
        self._lock = threading.Lock()  # tools and steps may finish on worker threads
        self._failed = False  # a write has failed (and been logged)

    def opened(self, session: str) -> None:
        self._write({"session": session, "event": "opened", "at": time.time()})

    def call(
        self, session: str, started: float, request: str | bytes | Any, reply: str | bytes | None
    ) -> None:
        """One request and its reply; frames that are JSON text are embedded verbatim."""
        self._write(
            {
                "session": session,
                "event": "call",
                "started": started,
                "ended": time.time(),
                "request": embedded_frame(request),
                "reply": embedded_frame(reply),
            }
        )

    def closed(self, session: str, reason: str) -> None:
        self._write({"session": session, "event": "closed", "at": time.time(), "reason": reason})
        self.flush()  # a finished session is on disk, for readers of a live server

    def flush(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._guarded(self._file.flush)

    def close(self) -> None:
        with self._lock:
            self._guarded(self._file.close)  # closed even when its last flush fails

    def _write(self, event: dict[str, Any]) -> None:
        line = orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE)
        with self._lock:
            if not self._file.closed:
                self._guarded(self._file.write, line)

    def _guarded(self, operation: Callable[..., object], *args: Any) -> None:
        # The recording watches the sessions, it is not part of them: a full disk
        # must not end them (it once dropped each connection it was recording).
        # Their events are lost meanwhile, which the log says once.
        try:
            operation(*args)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                logger.error("cannot write the recording %s, events are lost: %s", self.path, exc)
