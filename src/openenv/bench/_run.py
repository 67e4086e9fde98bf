"""The bookkeeping of one closed-loop run, shared by the client drivers.

A driver opens the connections and moves bytes; ``Run`` decides what each
session does next and records what happened. Each step reply costs one
``orjson.loads``, one comparison and one append, so the load generator stays
far cheaper per step than the server it measures.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson

from openenv import protocol
from openenv.client._base import auth_headers

__all__ = ["Run", "SessionStats", "now"]

now = time.perf_counter


class SessionStats:
    """One session's progress through connect, reset and its steps."""

    __slots__ = ("abort", "counted", "errored", "finished", "resetting", "sent")

    def __init__(self) -> None:
        self.abort: Callable[[], None] | None = None  # drop the connection (reply timeout)
        self.sent = 0.0  # when the frame awaiting its reply went out; 0: none awaited
        self.counted = 0  # step replies inside the measured window
        self.errored = False  # an error reply, a failed connect or a dropped connection
        self.finished = False  # stepped as long as asked
        self.resetting = False  # the episode ended; a reset is in flight

    @property
    def ok(self) -> bool:
        return self.finished and not self.errored


class Run:
    """Shared state of a run: the phases, the clock, and everything measured."""

    def __init__(
        self,
        sessions: int,
        steps: int | None,
        duration: float | None,
        warmup: float,
        action: dict[str, Any],
    ) -> None:
        self.sessions = sessions
        self.steps = steps
        self.duration = duration
        self.warmup = warmup
        # Sent on every handshake: the API key ($OPENENV_API_KEY), as clients send it.
        self.headers = auth_headers()
        self.reset_frame = protocol.request_frame("reset", {}).encode()
        self.step_frame = protocol.request_frame("step", action).encode()
        self.started = now()
        self.ready = 0  # sessions connected and reset (or failed doing so)
        self.all_ready = asyncio.Event()
        self.go = asyncio.Event()
        self.setup_time = 0.0
        self.measure_from = float("inf")
        self.measure_until = float("inf")
        self.stopping = False
        self.total_replies = 0
        self.latencies = array("d")
        self.connect_times = array("d")
        self.errors: Counter[str] = Counter()
        self.error_samples: dict[str, str] = {}
        self.cpu_from = 0.0
        self.cpu_until = 0.0
        self._done = False  # whether the reply just checked ended its episode
        self.last_measured = 0.0

    # -- phases -----------------------------------------------------------

    def session_ready(self) -> None:
        """A session finished connect + reset (or gave up); the last one opens the gate."""
        self.ready += 1
        if self.ready == self.sessions:
            self.setup_time = now() - self.started
            self.all_ready.set()

    def start_stepping(self) -> float:
        started = now()
        self.measure_from = started + self.warmup
        if self.duration is not None:
            self.measure_until = self.measure_from + self.duration
        return started

    def begin_measuring(self) -> None:
        self.cpu_from = time.process_time()

    def stop(self) -> None:
        """Duration over: sessions finish the step in flight and close."""
        self.stopping = True
        self.cpu_until = time.process_time()

    # -- per frame --------------------------------------------------------

    def connected(self, seconds: float) -> None:
        self.connect_times.append(seconds)

    def error(self, code: str, message: str = "") -> None:
        self.errors[code] += 1
        if code not in self.error_samples and message:
            self.error_samples[code] = message

    def reset_reply(self, stats: SessionStats, payload: bytes | str) -> bool:
        """Account the reply to ``reset``; ``True`` if the session may step."""
        # No reply is due while the session waits for the others to be ready.
        stats.sent = 0.0
        return self._check(payload)

    def step_reply(self, stats: SessionStats, payload: bytes | str, now: float) -> bytes | None:
        """Account one reply while stepping; the frame to send next, or ``None`` to stop.

        A step that ends the episode is followed by a reset (not counted as a
        step), then stepping goes on.
        """
        if stats.resetting:
            stats.resetting = False
            if not self._check(payload):
                stats.errored = True
            return self._next(stats)
        self.total_replies += 1
        good = self._check(payload)
        if not good:
            stats.errored = True
        if self.measure_from <= now <= self.measure_until:
            stats.counted += 1
            self.last_measured = now
            if good:
                self.latencies.append(now - stats.sent)
        if good and self._done:
            stats.resetting = True
            return self.reset_frame
        return self._next(stats)

    def _next(self, stats: SessionStats) -> bytes | None:
        if self.stopping or (self.steps is not None and stats.counted >= self.steps):
            stats.finished = True
            return None
        return self.step_frame

    def _check(self, payload: bytes | str) -> bool:
        self._done = False
        try:
            reply = orjson.loads(payload)
            if reply["type"] != "error":
                self._done = bool((reply.get("data") or {}).get("done"))
                return True
            data = reply["data"]
            self.error(str(data["code"]), str(data.get("message", "")))
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            self.error("INVALID_REPLY", repr(payload[:200]))
        return False
