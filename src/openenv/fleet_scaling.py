"""A fleet's scaling policy: when it adds a replica, retires one, keeps or removes it.

``Fleet`` (``fleet.py``) looks at its replicas every ``interval`` and then
asks ``_scale`` what to do; this is that decision, and the listing of a
replica as draining on its way out.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from openenv.fleet_replica import SERVING, ReplicaView

__all__ = ["FleetScaling"]

# The least time a replica is listed as draining before it is removed: a
# ServerPool reads /replicas every second by default, so by then every pool
# in use has seen it leave, and a session one of them placed there meanwhile
# has shown up in the replica's health and kept it.
_RETIRE_SECONDS = 2.0


class FleetScaling:
    """The scaling side of ``Fleet``: its replicas' number between its bounds."""

    min_replicas: int
    max_replicas: int
    scale_up_at: float
    idle_seconds: float
    interval: float
    _lock: threading.Lock
    _actors: list[Any]
    _views: dict[int, ReplicaView]
    _idle_since: float | None
    _retiring: Any
    _retiring_since: float
    _retiring_reported: str

    if TYPE_CHECKING:

        def serving(self) -> list[ReplicaView]: ...

        def _add(self) -> None: ...

        def _remove(self, actor: Any) -> None: ...

    def _retire(self) -> None:
        """Begin removing a replica: listed as draining, it gets no new session
        from the directory or a pool; ``_scale`` removes it once it has stayed
        empty that way for a while, or keeps it if a session showed up there."""
        with self._lock:
            if len(self._actors) <= self.min_replicas:
                return
            actor = self._actors[-1]
            view = self._views.get(id(actor))
            self._retiring, self._retiring_since = actor, time.monotonic()
            if view is not None and view.status in SERVING:
                self._retiring_reported, view.status = view.status, "draining"

    def _keep(self) -> None:
        """Call off a retirement: the replica takes sessions again."""
        with self._lock:
            actor, self._retiring = self._retiring, None
            view = self._views.get(id(actor))
            if view is not None and view.status == "draining":
                view.status = self._retiring_reported

    def _scale(self) -> None:
        # A degraded replica serves: its sessions count (it is not removed as idle
        # under them), and it is not a replica still on its way.
        views = self.serving()
        retiring = self._retiring
        with self._lock:
            count = len(self._actors)
            leaving = self._views.get(id(retiring)) if retiring is not None else None
        coming = count - len(views) - (retiring is not None)
        slots = sum(v.max_sessions for v in views)
        active = sum(v.active_sessions for v in views)
        queued = sum(v.queued_sessions for v in views)
        crowded = queued or (slots and active >= self.scale_up_at * slots)
        now = time.monotonic()
        if retiring is not None:
            # A session placed there before it was listed as draining (by a pool
            # that had not looked again yet) keeps it, as does a fleet that needs
            # its room again: removing it would close sessions with 1001.
            if crowded or (
                leaving is not None and (leaving.active_sessions or leaving.queued_sessions)
            ):
                self._idle_since = None
                self._keep()
            elif now - self._retiring_since >= max(2 * self.interval, _RETIRE_SECONDS):
                self._idle_since = now
                self._remove(retiring)
            return
        # Not while a replica is on its way (starting, restarting, unreachable):
        # its room is not counted yet, and adding one per interval until it shows
        # up would overshoot to max_replicas on every burst.
        if crowded and not coming and count < self.max_replicas:
            self._idle_since = None
            self._add()
            return
        if active or queued:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now
        elif now - self._idle_since >= self.idle_seconds and count > self.min_replicas:
            self._retire()
