"""What a load run measured, and how to read percentiles out of it."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BenchReport", "percentile"]


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of an already sorted sequence; 0 when empty.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 99)
    (2.0, 4.0)
    >>> percentile([], 50)
    0.0
    """
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class BenchReport:
    """The outcome of ``run_bench``: throughput, latency, connect times and errors.

    Times are in seconds. ``latencies`` and ``connect_times`` are sorted.

    >>> report = BenchReport(url="ws://h/ws", sessions=2, client="picows", steps=4,
    ...                      elapsed=0.5, latencies=[0.001, 0.002, 0.002, 0.004])
    >>> report.steps_per_second, report.latency(50), report.to_dict()["latency_ms"]["max"]
    (8.0, 0.002, 4.0)
    """

    url: str
    sessions: int
    client: str
    steps: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    connect_times: list[float] = field(default_factory=list)
    setup_time: float = 0.0
    sessions_ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: dict[str, str] = field(default_factory=dict)
    client_cpu: float = 0.0

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def sessions_failed(self) -> int:
        return self.sessions - self.sessions_ok

    def latency(self, q: float) -> float:
        """Step latency percentile, in seconds."""
        return percentile(self.latencies, q)

    def connect_time(self, q: float) -> float:
        """Connect (TCP + WebSocket handshake) time percentile, in seconds."""
        return percentile(self.connect_times, q)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (milliseconds for latencies, no raw samples)."""

        def ms(values: Sequence[float]) -> dict[str, float]:
            return {
                **{f"p{q}": round(percentile(values, q) * 1000, 3) for q in (50, 90, 99)},
                "max": round(values[-1] * 1000, 3) if values else 0.0,
            }

        return {
            "url": self.url,
            "client": self.client,
            "sessions": self.sessions,
            "sessions_ok": self.sessions_ok,
            "steps": self.steps,
            "elapsed_s": round(self.elapsed, 4),
            "steps_per_s": round(self.steps_per_second, 1),
            "latency_ms": ms(self.latencies),
            "connect_ms": ms(self.connect_times),
            "setup_s": round(self.setup_time, 4),
            "errors": dict(self.errors),
            "error_samples": self.error_samples,
            "client_cpu": round(self.client_cpu, 3),
        }
