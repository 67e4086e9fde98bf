"""Prometheus metrics of one served environment (``GET /metrics``).

Each app has its own registry, so several apps in one process (tests, a
multi-environment server) never mix their numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from openenv.server.sessions import SessionRegistry

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Step latencies of RL environments span microseconds (echo) to minutes (code runs).
# fmt: off
_STEP_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
)
# fmt: on


class Metrics:
    """The counters a server keeps; rendered in Prometheus text format."""

    def __init__(self, sessions: SessionRegistry) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Gauge("openenv_sessions_active", "Sessions holding a slot.", registry=r).set_function(
            lambda: sessions.active
        )
        Gauge("openenv_sessions_capacity", "Session slots in all.", registry=r).set_function(
            lambda: sessions.max_sessions
        )
        Gauge(
            "openenv_sessions_queued", "Connections waiting for a free slot.", registry=r
        ).set_function(lambda: sessions.queued)
        self.opened = Counter("openenv_sessions_opened", "Sessions opened.", registry=r)
        self.closed = Counter(
            "openenv_sessions_closed", "Sessions closed, by reason.", ["reason"], registry=r
        )
        self.steps = Counter("openenv_steps", "Steps served.", registry=r)
        self.step_seconds = Histogram(
            "openenv_step_seconds",
            "Time spent in step(), in seconds.",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.errors = Counter("openenv_errors", "Error frames sent, by code.", ["code"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
