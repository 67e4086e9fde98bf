"""Prometheus metrics of one served environment (``GET /metrics``).

The hot path only bumps plain integers: every session of an app runs on one
event loop thread, so counting needs no lock (prometheus_client's metric
objects take one per update, a measurable share of a cheap step). The
numbers become Prometheus metric families when ``/metrics`` is scraped.
Each app has its own registry, so several apps in one process (tests, a
multi-environment server) never mix their numbers. Under ``--workers N``
each worker publishes its counters on the shared board once a second and a
scrape of any worker adds them all up (``server/slot_board.py``).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from openenv.server.slots import SessionRegistry

__all__ = ["CONTENT_TYPE", "Histogram", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Step latencies of RL environments span microseconds (echo) to minutes (code runs).
# fmt: off
_STEP_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
)
# fmt: on


class Histogram:
    """A lock-free histogram for one event loop thread.

    >>> h = Histogram((0.1, 1.0))
    >>> for seconds in (0.05, 0.5, 5.0):
    ...     h.observe(seconds)
    >>> h.observe(0.5, count=2)
    >>> h.cumulative(), h.count
    ([('0.1', 1), ('1.0', 4), ('+Inf', 5)], 5)
    """

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, seconds: float, count: int = 1) -> None:
        """Count ``count`` observations of ``seconds`` each."""
        self.counts[bisect.bisect_left(self.buckets, seconds)] += count
        self.sum += seconds * count

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        total, out = 0, []
        for bound, n in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class Metrics:
    """The counters a server keeps; rendered in Prometheus text format.

    prometheus_client is imported at the first scrape, not with the server:
    it is a tenth of a second of every cold start.
    """

    def __init__(self, sessions: SessionRegistry) -> None:
        self._sessions = sessions
        self.opened = 0
        self.closed: Counter[str] = Counter()
        self.step_seconds = Histogram(_STEP_BUCKETS)
        self.errors: Counter[str] = Counter()
        # v2 connections not read until their replies go out, counted when asked
        # (the service counts its connections; none without one).
        self.count_v2_paused: Callable[[], int] = lambda: 0

    @property
    def steps(self) -> int:
        """Steps served: one per observation of ``step_seconds``."""
        return self.step_seconds.count

    def numbers(self) -> dict[str, Any]:
        """This process's counters, as plain JSON (what a worker publishes).

        >>> m = Metrics(None)  # type: ignore[arg-type]
        >>> for seconds in (0.001, 0.002, 0.5):
        ...     m.step_seconds.observe(seconds)
        >>> m.errors["TIMEOUT"] = 1
        >>> m.numbers()["steps"], m.numbers()["errors"]
        (3, {'TIMEOUT': 1})
        """
        return {
            "opened": self.opened,
            "closed": dict(self.closed),
            "steps": self.steps,
            "step_counts": self.step_seconds.counts,
            "step_sum": self.step_seconds.sum,
            "errors": dict(self.errors),
            # Gauges describe live workers: a dead one's are dropped (slot_board.py).
            "gauges": {"v2_paused": self.count_v2_paused()},
        }

    def collect(self) -> Iterator[Metric]:
        """The metric families, as a prometheus_client ``Collector`` yields them."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        from openenv.server.slots import add_numbers

        sessions = self._sessions
        total = self.numbers()
        if sessions.board is not None:
            # Which worker answers a scrape is the kernel's choice. Publishing
            # what this one shows makes every later scrape, by any worker (or
            # after this one dies), count at least as much: counters never go
            # back, which Prometheus would take for a restart.
            sessions.board.publish(total)
            for numbers in sessions.board.peer_numbers():
                total = add_numbers(total, numbers)
        step_seconds = Histogram(self.step_seconds.buckets)
        step_seconds.counts, step_seconds.sum = total["step_counts"], total["step_sum"]
        active, queued = sessions.totals()
        yield GaugeMetricFamily("openenv_sessions_active", "Sessions holding a slot.", value=active)
        yield GaugeMetricFamily(
            "openenv_sessions_capacity", "Session slots in all.", value=sessions.max_sessions
        )
        yield GaugeMetricFamily(
            "openenv_sessions_queued", "Connections waiting for a free slot.", value=queued
        )
        yield CounterMetricFamily(
            "openenv_sessions_opened", "Sessions opened.", value=total["opened"]
        )
        closed = CounterMetricFamily(
            "openenv_sessions_closed", "Sessions closed, by reason.", labels=["reason"]
        )
        for reason, n in sorted(total["closed"].items()):
            closed.add_metric([reason], n)
        yield closed
        yield CounterMetricFamily("openenv_steps", "Steps served.", value=total["steps"])
        yield HistogramMetricFamily(
            "openenv_step_seconds",
            "Seconds from a step's request being read and checked to its reply.",
            buckets=step_seconds.cumulative(),
            sum_value=step_seconds.sum,
        )
        errors = CounterMetricFamily(
            "openenv_errors", "Error frames sent, by code.", labels=["code"]
        )
        for code, n in sorted(total["errors"].items()):
            errors.add_metric([code], n)
        yield errors
        yield GaugeMetricFamily(
            "openenv_v2_connections_paused",
            "Protocol v2 connections not read until their replies go out "
            "(max_requests_in_flight reached, or a reply waiting on the socket: "
            "the client reads slower than it sends).",
            value=total["gauges"]["v2_paused"],
        )

    def render(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        # A registry per scrape: this app's numbers only, whatever else the
        # process registered globally.
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # a Collector by duck typing: collect() is all it calls
        return generate_latest(registry)
