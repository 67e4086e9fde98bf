"""A fleet: one environment served by many openenv servers across a Ray cluster.

``Fleet("envs/echo_env", replicas=4)`` starts four replicas, each a full
openenv server (the folder's ``server/app.py`` under openenv's runner) inside
a Ray actor, placed by Ray's scheduler (``num_cpus``, custom ``resources``,
spread over the nodes) and restarted by Ray when its process dies. The fleet
has **one address**: a small directory server whose ``GET /replicas`` lists
every replica with its URL and occupancy, and whose ``GET /health`` sums
them. Clients hand that address to a ``ServerPool``, which opens each session
on the replica with the most room; a plain client given it (``/ws``) is
redirected (307) to the replica with the most room as it connects, and a
``GET`` of any other route (``/schema``, ``/tasks``, ``/tools``...) is
answered by a replica that is up.

The fleet scales itself between ``min_replicas`` and ``max_replicas``: one
more replica when sessions queue anywhere or the fleet's slots are more than
``scale_up_at`` full (once no replica is still starting); one fewer when it
has held no session for ``idle_seconds``, after listing it as draining long
enough for the pools to see it go (a session that reached it meanwhile keeps
it). From the command line: ``openenv serve PATH --ray --replicas N``
(``RAY_ADDRESS`` joins an existing cluster; otherwise a local one starts).

Why plain actors and not Ray Serve, measured (``benchmarks/fleet_vs_serve.py``):
behind Serve's proxy one replica made 1,931 steps/s at a 32 ms median, against
58,773 at 1.0 ms when clients reach the replica's socket, as here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from openenv import protocol
from openenv.fleet_directory import Directory
from openenv.fleet_health import HealthChecks
from openenv.fleet_replica import SERVING, Replica, ReplicaView, load_problem
from openenv.fleet_scaling import FleetScaling

__all__ = ["Fleet", "ReplicaView"]

logger = logging.getLogger("openenv.fleet")

# Seconds to wait for the app's import check: a worker to start, the app to import.
_CHECK_TIMEOUT = 120.0
# Seconds a replica's own drain may take (its sessions closed, its server stopped).
_REPLICA_STOP_TIMEOUT = 60.0
# A start past its allowance doubles the next start's, up to this many start_timeouts.
_MOST_PATIENCE = 8


def _free(view: ReplicaView) -> int:
    return view.max_sessions - view.active_sessions - view.queued_sessions


class Fleet(FleetScaling):
    """Replicas of one environment across a Ray cluster, behind one directory address.

    >>> fleet = Fleet("envs/echo_env", replicas=2, max_replicas=4)
    >>> (fleet.min_replicas, fleet.max_replicas)
    (2, 4)

    Use it as a context manager (``with Fleet(...) as url:``), or call
    ``start()`` and ``stop()``.

    Args:
        path: The environment folder (its ``server/app.py``), readable on every node.
        replicas: Replicas to start with.
        min_replicas / max_replicas: Bounds for scaling (default: ``replicas``).
        max_sessions: Each replica's session cap (``OPENENV_MAX_CONCURRENT_ENVS``).
        num_cpus: CPUs Ray reserves for each replica (fractions are fine).
        resources: Custom Ray resources each replica needs, e.g. ``{"gpu_box": 1}``.
        environ: Environment variables for the replicas' processes.
        host: The directory's interface (default ``127.0.0.1``; ``0.0.0.0`` for all).
        port: The directory's port (0: any free one).
        replica_host: The replicas' interface (default: their node's IP address).
        scale_up_at: Occupancy (open / slots) above which a replica is added.
        idle_seconds: Seconds without sessions before a replica is removed.
        interval: Seconds between health checks and scaling decisions.
        health_timeout: Seconds a replica has to answer ``/health`` before it
            counts as down (default: ``interval``, at least 2).
        start_timeout: Seconds a replica may go without serving (starting,
            restarting, or its ``/health`` unanswered: its app hangs, its event
            loop is blocked, or Ray found no room for it) before it is replaced;
            until then the fleet counts it as room on its way and adds no other.
            A start that takes longer doubles the time the next start is given
            (up to 8 times ``start_timeout``), so replicas that start slower
            than ``start_timeout`` still come up, an attempt or a few later.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        replicas: int = 1,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        max_sessions: int | None = None,
        num_cpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
        environ: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        replica_host: str | None = None,
        scale_up_at: float = 0.8,
        idle_seconds: float = 30.0,
        interval: float = 1.0,
        health_timeout: float | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        self.min_replicas = replicas if min_replicas is None else min_replicas
        self.max_replicas = max(
            replicas, self.min_replicas if max_replicas is None else max_replicas
        )
        if not 1 <= self.min_replicas <= replicas <= self.max_replicas:
            raise ValueError(
                f"need 1 <= min_replicas ({self.min_replicas}) <= replicas ({replicas}) "
                f"<= max_replicas ({self.max_replicas})"
            )
        self.folder = str(Path(path).resolve())
        self.replicas = replicas
        self.environ = dict(environ or {})
        if max_sessions is not None:
            self.environ["OPENENV_MAX_CONCURRENT_ENVS"] = str(max_sessions)
        self.num_cpus = num_cpus
        self.resources = dict(resources or {})
        self.host, self.port, self.replica_host = host, port, replica_host
        self.scale_up_at = scale_up_at
        self.idle_seconds = idle_seconds
        self.interval, self.start_timeout = interval, start_timeout
        self.url = ""
        self._actors: list[Any] = []
        self._views: dict[int, ReplicaView] = {}  # by id() of the actor handle
        # A replica starting (or restarting) is a where() call not yet answered.
        self._pending: dict[int, Any] = {}
        # Since when a replica has not served (from its start, or its health's last
        # failure): room on its way, which scaling waits for up to its allowance (below).
        self._unwell_since: dict[int, float] = {}
        # How long each replica's start may take, and the next one's: start_timeout,
        # doubled after each start that took longer. Once up, a replica is allowed
        # start_timeout again (a restart, or its health unanswered).
        self._allowed: dict[int, float] = {}
        self._raised_allowance: float | None = None  # None: start_timeout
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._idle_since: float | None = None
        # The replica on its way out (listed as draining, given no session), and
        # since when; the status its health reported meanwhile, to restore if kept.
        self._retiring: Any = None
        self._retiring_since = 0.0
        self._retiring_reported = "healthy"
        self._directory: Any = None
        self._threads: list[threading.Thread] = []
        self._replica_class: Any = None
        self._health = HealthChecks(
            timeout=max(interval, 2.0) if health_timeout is None else health_timeout
        )

    # -- life ---------------------------------------------------------------

    def start(self) -> str:
        """Start the replicas and the directory; return the directory's URL."""
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False)
        self._check_loads()
        self._replica_class = ray.remote(max_restarts=-1, max_task_retries=-1)(Replica)
        try:
            for _ in range(self.replicas):
                self._add()
            self._refresh()
            self._directory = Directory(self)
            self.url = self._directory.start(self.host, self.port)
        except BaseException:  # the directory's port taken, Ctrl+C...: no replica left behind
            self.stop()
            raise
        control = threading.Thread(target=self._control, name="openenv-fleet", daemon=True)
        control.start()
        self._threads.append(control)
        return self.url

    def _check_loads(self) -> None:
        """Import the app once where a replica would run, as ``openenv serve`` does
        before it serves: Ray would restart a replica whose app cannot load for
        ever, each time with the same traceback, and the fleet would never serve."""
        import ray
        from ray.exceptions import GetTimeoutError

        from openenv.cli.app_loader import AppLoadError

        options: dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
        if self.resources:
            options["resources"] = self.resources
        check = ray.remote(**options)(load_problem).remote(self.folder, self.environ)
        try:
            problem = ray.get(check, timeout=_CHECK_TIMEOUT)
        except GetTimeoutError:  # no node with room yet: the replicas will wait for one too
            ray.cancel(check)
            logger.warning(
                "could not import %s on the cluster within %ss; starting anyway",
                self.folder,
                _CHECK_TIMEOUT,
            )
            return
        except BaseException:  # interrupted: an import that hangs must not go on alone
            ray.cancel(check)
            raise
        if problem is not None:
            raise AppLoadError(problem)

    def stop(self) -> None:
        """Drain every replica, remove it, stop the directory."""
        import ray

        self._stopping.set()
        for thread in self._threads:
            # It may be removing a replica: that replica's drain has this long.
            thread.join(_REPLICA_STOP_TIMEOUT + self.interval + 5)
        with self._lock:
            actors, self._actors = self._actors, []
        with contextlib.suppress(Exception):
            ray.get([actor.stop.remote() for actor in actors], timeout=_REPLICA_STOP_TIMEOUT)
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if self._directory is not None:
            self._directory.stop()
        self._health.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- what the directory shows -----------------------------------------

    def views(self) -> list[ReplicaView]:
        """Every replica as last seen."""
        with self._lock:
            return [self._views[id(actor)] for actor in self._actors if id(actor) in self._views]

    def where(self) -> list[dict[str, Any]]:
        """Each replica's URL, node id and process id, asked of the replicas now."""
        import ray

        with self._lock:
            actors = list(self._actors)
        return list(ray.get([actor.where.remote() for actor in actors], timeout=60))

    def serving(self) -> list[ReplicaView]:
        """The replicas that take sessions: "healthy" ones, then "degraded" ones
        (slowed, their loop blocked lately, but serving)."""
        views = self.views()
        return [v for status in SERVING for v in views if v.status == status]

    def place(self) -> str | None:
        """The replica with the most room, a healthy one if any has room, else a
        degraded one (its slot counted until the next look)."""
        with self._lock:
            views = [self._views[id(a)] for a in self._actors if id(a) in self._views]
            for status in SERVING:
                room = [v for v in views if v.status == status and _free(v) > 0]
                if room:
                    best = max(room, key=_free)
                    best.active_sessions += 1  # so a burst spreads before the next look
                    return best.url
            return None

    # -- scaling ------------------------------------------------------------

    def _add(self) -> None:
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "scheduling_strategy": "SPREAD"}
        if self.resources:
            options["resources"] = self.resources
        actor = self._replica_class.options(**options).remote(
            self.folder, self.environ, self.replica_host
        )
        with self._lock:
            self._actors.append(actor)
            self._allowed[id(actor)] = self._raised_allowance or self.start_timeout

    def _remove(self, actor: Any) -> None:
        import ray

        with self._lock:
            self._retiring = None
            if actor not in self._actors or len(self._actors) <= self.min_replicas:
                return
            self._actors.remove(actor)
            self._forget(actor)
        with contextlib.suppress(Exception):
            ray.get(actor.stop.remote(), timeout=_REPLICA_STOP_TIMEOUT)
        ray.kill(actor, no_restart=True)

    def _control(self) -> None:
        while not self._stopping.wait(self.interval):
            self._refresh()
            self._scale()

    def _refresh(self) -> None:
        """Ask every replica where it is (once, or again after a restart) and how full it is."""
        import ray
        from ray.exceptions import RayActorError

        with self._lock:
            actors = list(self._actors)
            for actor in actors:  # a restarted replica listens on a new port: ask again
                view = self._views.get(id(actor))
                if (view is None or view.status == "down") and id(actor) not in self._pending:
                    self._pending[id(actor)] = actor.where.remote()
                    self._unwell_since.setdefault(id(actor), time.monotonic())
            asked = {id(a): self._pending[id(a)] for a in actors if id(a) in self._pending}
        dead: list[tuple[Any, Exception]] = []
        # One bounded wait for all of them, so a slow start never holds up the others.
        answered: set[str] = set()
        if asked:
            refs = list(asked.values())
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.interval)
            answered = {ref.hex() for ref in ready}
        for actor in actors:
            view = self._views.get(id(actor))
            ref = asked.get(id(actor))
            if ref is not None:
                if ref.hex() not in answered:
                    if view is not None:
                        view.status = "down"
                    if self._overdue(actor):  # its start hangs, or is slower: replace it
                        dead.append((actor, TimeoutError(self._slow_start(actor))))
                    continue
                with self._lock:
                    self._pending.pop(id(actor), None)
                try:
                    found = ray.get(ref)
                except RayActorError as gone:  # dead for good: Ray will not restart it
                    dead.append((actor, gone))
                    continue
                except Exception:
                    if view is not None:
                        view.status = "down"
                    continue
                view = ReplicaView(found["url"], node=found["node"], pid=found["pid"])
                with self._lock:  # listed as starting until its health answers
                    if actor in self._actors:
                        self._views[id(actor)] = view
            elif view is None:
                continue
            self._health.ask(id(actor), view.url)
        # Asked all at once, and waited for as the starts are: one that does not
        # answer holds up no other, and is read at a later look.
        answers = self._health.answers(self.interval)
        for actor in actors:
            view = self._views.get(id(actor))
            answer = answers.get(id(actor))
            if view is None or answer is None or answer[0] != view.url:
                continue  # not asked, not answered yet, or asked where it no longer is
            health = answer[1]
            if not isinstance(health, protocol.Health):  # unreachable, timed out, not JSON
                view.status = "down"
                self._unwell_since.setdefault(id(actor), time.monotonic())
                if self._overdue(actor):  # its loop blocked, its server gone...
                    late = f"not serving for its start_timeout, {self.start_timeout:g}s"
                    dead.append((actor, TimeoutError(late)))
                continue
            self._unwell_since.pop(id(actor), None)
            self._allowed[id(actor)] = self.start_timeout
            view.status = health.status
            if actor is self._retiring and health.status in SERVING:
                self._retiring_reported, view.status = health.status, "draining"
            view.active_sessions = health.active_sessions
            view.max_sessions = health.max_sessions
            view.queued_sessions = health.queued_sessions
        for actor, reason in dead:
            self._replace(actor, reason)

    def _overdue(self, actor: Any) -> bool:
        since = self._unwell_since.get(id(actor))
        allowed = self._allowed.get(id(actor), self.start_timeout)
        return since is not None and time.monotonic() - since > allowed

    def _slow_start(self, actor: Any) -> str:
        """Why a replica not up in time is given up; the next start gets twice as
        long (a start this slow may be this machine's usual one, not a hang)."""
        allowed = self._allowed.get(id(actor), self.start_timeout)
        doubled = min(2 * allowed, _MOST_PATIENCE * self.start_timeout)
        # A restart's allowance may be below one a new replica got earlier.
        self._raised_allowance = max(self._raised_allowance or 0.0, doubled)
        if allowed == self.start_timeout:
            late = f"not up within its start_timeout, {allowed:g}s"
        else:
            late = f"not up within {allowed:g}s (start_timeout {self.start_timeout:g}s, doubled)"
        return f"{late}; the next start is given {self._raised_allowance:g}s"

    def _forget(self, actor: Any) -> None:
        """Drop what is kept about a replica that is gone (with the lock held)."""
        self._views.pop(id(actor), None)
        self._health.forget(id(actor))
        self._pending.pop(id(actor), None)
        self._unwell_since.pop(id(actor), None)
        self._allowed.pop(id(actor), None)

    def _replace(self, actor: Any, exc: Exception) -> None:
        """A replica Ray gave up on (killed with ``ray.kill``, or its restart failed:
        an error in its constructor), or one past ``start_timeout``: a new one takes
        its place. Kept, it would count as room on its way for ever, and the fleet
        would never grow."""
        import ray

        reason = str(exc).strip().splitlines()
        logger.warning(
            "a replica of %s is given up (%s); starting another",
            self.folder,
            reason[0] if reason else type(exc).__name__,
        )
        with self._lock:
            if actor not in self._actors or self._stopping.is_set():
                return
            self._actors.remove(actor)
            self._forget(actor)
            # One that was on its way out is not replaced, above the floor.
            retired = actor is self._retiring and len(self._actors) >= self.min_replicas
            if actor is self._retiring:
                self._retiring = None
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        if not retired:
            self._add()
