"""``RayRuntime``: async Ray actors fed one task at a time by the driver."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import RayError

from openenv.runtime.base import BatchSettings, ResultCallback, RuntimeEngine, collect, finish
from openenv.runtime.config import RunConfig
from openenv.runtime.dispatch import Dispatcher, WorkerLost, serve
from openenv.runtime.shipping import EpisodeWorker, Parcel, pack_tasks
from openenv.runtime.task import Task, TaskResult

__all__ = ["RayRuntime", "connect"]


class RayRuntime(RuntimeEngine):
    """Runs tasks on ``worker_num`` async Ray actors, each with ``max_concurrency`` in flight.

    The driver hands each actor the next task whenever one of its episodes
    ends, so slow tasks and slow nodes hold up only themselves, and each
    result comes back as its own Ray object the moment it is in. An actor
    that dies (its node lost, its process killed) is replaced, and the
    episodes it was playing go to another actor; finished ones are never
    played again (Ray's own retries are off). Actors stay up for the next
    run in this program.

    Each actor asks for ``min(1, cluster CPUs / worker_num)`` CPUs, so a run
    with more workers than CPUs shares them (episodes mostly wait on the
    network) instead of queueing; ``engine_options`` go to ``.options()``
    (``num_cpus``, ``resources``, ``runtime_env``...) and win.

    Ray is used as found: an already initialised Ray, else a new local
    cluster when ``in_local``, else the cluster at ``RAY_ADDRESS`` (or
    whatever ``ray.init()`` finds or starts).
    """

    async def run(self, tasks: Sequence[Task], on_result: ResultCallback) -> list[TaskResult]:
        blobs = pack_tasks(tasks)  # an agent that cannot travel fails here, before any runs
        connect(self.config)
        settings = BatchSettings.from_config(self.config)
        results, record = collect(tasks, on_result)
        dispatcher = Dispatcher(tasks, blobs, settings, record)
        workers = 1 if settings.sequence_dependent else min(self.config.worker_num, len(tasks))
        options = _actor_options(self.config, workers)
        key = (repr(sorted(options.items())), _cluster())
        sys_path = list(sys.path)
        _release_idle_except(key)

        async def start() -> _ActorWorker:
            idle = _idle.setdefault(key, [])
            actor = idle.pop() if idle else _actor_class().options(**options).remote()
            await actor.begin.remote(settings, sys_path)
            return _ActorWorker(actor, idle)

        await serve(dispatcher, start, workers, settings.max_concurrency)
        return finish(results, tasks)


def _actor_options(config: RunConfig, workers: int) -> dict[str, Any]:
    cpus = ray.cluster_resources().get("CPU", 1.0)  # type: ignore[no-untyped-call]
    return {
        "num_cpus": min(1.0, cpus / workers),
        # Every call is one episode, at most once: Ray must not replay it.
        "max_restarts": 0,
        "max_task_retries": 0,
        # The run's episodes, plus begin/end beside them.
        "max_concurrency": config.max_concurrency + 2,
        **config.engine_options,
    }


def _cluster() -> str:
    # Actors belong to one cluster connection; a new ray.init() makes new ones.
    context = ray.get_runtime_context()
    return f"{context.get_job_id()}:{context.get_node_id()}"


# Idle actors between runs, by their options and cluster.
_idle: dict[tuple[str, str], list[Any]] = {}


def _release_idle_except(key: tuple[str, str]) -> None:
    # Idle actors hold their CPUs: those of other options (or an old cluster)
    # would keep this run's actors from being placed.
    for other in [k for k in _idle if k != key]:
        for actor in _idle.pop(other):
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)


class _ActorWorker:
    """One actor as ``serve`` drives it, for one run."""

    def __init__(self, actor: Any, idle: list[Any]) -> None:
        self.actor = actor
        self.died = asyncio.Event()
        self._idle = idle

    async def play(self, parcel: Parcel) -> bytes:
        if self.died.is_set():
            raise WorkerLost("the Ray actor is gone", sent=False)
        try:
            data: bytes = await self.actor.play.remote(parcel)
        except RayError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkerLost(f"the Ray actor was lost: {reason}", sent=True) from exc
        return data

    async def finish(self) -> None:
        try:
            await self.actor.end.remote()
        except RayError:
            self.abort()
            return
        self._idle.append(self.actor)

    def rest(self) -> None:
        with contextlib.suppress(Exception):
            self.actor.rest.remote()

    def abort(self) -> None:
        self.died.set()
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


class EpisodeActor:
    """The Ray actor: an ``EpisodeWorker`` whose event loop is the actor's own."""

    def __init__(self) -> None:
        self.worker = EpisodeWorker()

    async def begin(self, settings: BatchSettings, sys_path: list[str]) -> None:
        self.worker.begin(settings, sys_path)

    async def play(self, parcel: Parcel) -> bytes:
        return await self.worker.play(parcel)

    async def end(self) -> None:
        await self.worker.end()

    async def rest(self) -> None:
        if not self.worker.busy:
            await self.worker.end()

    async def pid(self) -> int:
        return os.getpid()


_remote: Any = None


def _actor_class() -> Any:
    global _remote
    if _remote is None:
        _remote = ray.remote(EpisodeActor)
    return _remote


def connect(config: RunConfig) -> None:
    """Start or join Ray, unless this process already has."""
    if ray.is_initialized():
        return
    options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if config.in_local:
        ray.init(
            address="local",
            num_cpus=max(config.worker_num, os.cpu_count() or 1),
            object_store_memory=256 * 2**20,
            **options,
        )
    else:
        ray.init(address=os.environ.get("RAY_ADDRESS"), **options)
