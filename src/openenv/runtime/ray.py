"""``RayRuntime``: Ray actors that call the driver back and are fed one task at a time."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import RayError

from openenv.runtime.base import BatchSettings, ResultCallback, RuntimeEngine, collect, finish
from openenv.runtime.channel import CalledBackWorker, Switchboard, call_back, called_in
from openenv.runtime.config import RunConfig
from openenv.runtime.dispatch import Dispatcher, serve
from openenv.runtime.shipping import pack_tasks
from openenv.runtime.task import Task, TaskResult

__all__ = ["RayRuntime", "connect"]


class RayRuntime(RuntimeEngine):
    """Runs tasks on ``worker_num`` async Ray actors, each with ``max_concurrency`` in flight.

    Ray places the actors (and restarts nothing: the driver does that); each
    actor calls back to the driver over TCP, as a Spark worker does, and the
    driver hands it the next task whenever one of its episodes ends, so slow
    tasks and slow nodes hold up only themselves, and each result comes back
    the moment it is in. An actor that dies (its node lost, its process
    killed) is replaced, and the episodes it was playing go to another actor;
    finished ones are never played again. Actors stay up for the next run in
    this program.

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
        numbers = itertools.count()
        # Actors reach the driver where Ray reaches it: this node's address.
        host: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        _running[key] += 1  # its actors are not kept idle while another run wants room
        try:
            async with Switchboard(host) as board:

                async def start() -> _ActorWorker:
                    idle = _idle.setdefault(key, [])
                    while idle:
                        actor = idle.pop()
                        try:
                            return await begin(actor)
                        except RuntimeError:
                            # Kept from an earlier run, and died since (its node lost, its
                            # process killed): not a failure to start one, try the next.
                            with contextlib.suppress(Exception):
                                ray.kill(actor, no_restart=True)
                    return await begin(_actor_class().options(**options).remote())

                async def begin(actor: Any) -> _ActorWorker:
                    number = next(numbers)
                    accepted = board.expect(number)
                    outcome = asyncio.ensure_future(
                        _outcome(actor.work.remote(*board.address, board.token, number))
                    )

                    def call_off() -> None:
                        # An actor left pending would hold its place in Ray's queue.
                        outcome.cancel()
                        with contextlib.suppress(Exception):
                            ray.kill(actor, no_restart=True)

                    reader, writer = await called_in(accepted, outcome, call_off)
                    worker = _ActorWorker(actor, reader, writer, outcome, key)
                    worker.begin(settings, sys_path)
                    return worker

                await serve(dispatcher, start, workers, settings.max_concurrency)
        finally:
            _running[key] -= 1
        return finish(results, tasks)


async def _outcome(call: Any) -> str:
    """How an actor's ``work`` call ended: it returns when its run does, or fails with it."""
    try:
        await call
    except RayError as exc:
        text = str(exc).strip()
        return f"the Ray actor was lost: {text.splitlines()[0] if text else type(exc).__name__}"
    return "the Ray actor ended its run"


def _actor_options(config: RunConfig, workers: int) -> dict[str, Any]:
    cpus = ray.cluster_resources().get("CPU", 1.0)  # type: ignore[no-untyped-call]
    return {
        "num_cpus": min(1.0, cpus / workers),
        # Every call is one episode, at most once: Ray must not replay it.
        "max_restarts": 0,
        "max_task_retries": 0,
        # One long work() call per run; pid() for tests and tools beside it.
        "max_concurrency": 4,
        **config.engine_options,
    }


def _cluster() -> str:
    # Actors belong to one cluster connection; a new ray.init() makes new ones.
    context = ray.get_runtime_context()
    return f"{context.get_job_id()}:{context.get_node_id()}"


# Idle actors between runs, by their options and cluster.
_idle: dict[tuple[str, str], list[Any]] = {}
# Runs going on in this program, by the options and cluster of their actors.
_running: Counter[tuple[str, str]] = Counter()


def _release_idle_except(key: tuple[str, str]) -> None:
    # Idle actors hold their CPUs: those of other options (or an old cluster)
    # would keep this run's actors from being placed.
    for other in [k for k in _idle if k != key]:
        for actor in _idle.pop(other):
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)


class _ActorWorker(CalledBackWorker):
    """One actor's connection back to the driver, for one run."""

    what = "the Ray actor"

    def __init__(
        self,
        actor: Any,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        outcome: asyncio.Future[str],
        key: tuple[str, str],
    ) -> None:
        self.actor = actor
        self._key = key
        super().__init__(reader, writer, outcome)

    def _kept(self) -> None:
        # Kept idle, it holds its CPUs: a run of other options going on now (its
        # actors waiting for room) would wait for them for ever.
        if any(n and k != self._key for k, n in _running.items()):
            self._stop()
        else:
            _idle.setdefault(self._key, []).append(self.actor)

    def _stop(self) -> None:
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


class EpisodeActor:
    """The Ray actor: plays what the driver hands it over its connection, on the actor's loop."""

    async def work(self, host: str, port: int, token: bytes, number: int) -> None:
        await call_back(host, port, token, number)

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
