"""``SparkRuntime``: one Spark job per episode, submitted as Spark's slots free up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pyspark import SparkConf, SparkContext

from openenv.errors import EngineError
from openenv.runtime.base import BatchSettings, ResultCallback, RuntimeEngine, collect, finish
from openenv.runtime.config import RunConfig
from openenv.runtime.dispatch import Dispatcher, WorkerLost, serve
from openenv.runtime.episode import run_coroutine
from openenv.runtime.shipping import EpisodeWorker, Parcel, pack_tasks
from openenv.runtime.task import Task, TaskResult

__all__ = ["SparkRuntime", "context", "local_context"]

_LOG_CONFIG = Path(__file__).with_name("spark-log4j2.properties")


class SparkRuntime(RuntimeEngine):
    """Runs each task as its own Spark job of one partition, as Spark's slots free up.

    One episode per Spark task is what makes Spark exactly-once and
    streaming: a result reaches the driver the moment its job ends, and a
    crashed Python worker (or a lost executor) costs only the episode it was
    playing, which goes to another job (Spark's own retry of a task also
    only replays an unfinished episode). The cost: episodes in flight are
    Spark's task slots (cores), not ``max_concurrency`` per partition, and
    each episode pays a job's overhead (a few ms locally). Up to
    ``worker_num * max_concurrency`` jobs are submitted at once, capped at
    twice Spark's default parallelism (more would only queue in Spark).

    The context is the active one, else ``local[worker_num]`` when
    ``in_local``, else the master that Spark is configured with
    (``spark-submit``, or ``engine_options``).
    """

    async def run(self, tasks: Sequence[Task], on_result: ResultCallback) -> list[TaskResult]:
        blobs = pack_tasks(tasks)  # an agent that cannot travel fails here, before any runs
        sc = await asyncio.to_thread(context, self.config)
        settings = BatchSettings.from_config(self.config)
        results, record = collect(tasks, on_result)
        dispatcher = Dispatcher(tasks, blobs, settings, record)
        config = self.config
        jobs = min(
            len(tasks), config.worker_num * config.max_concurrency, 2 * sc.defaultParallelism
        )
        jobs = 1 if settings.sequence_dependent else max(jobs, 1)
        header = (settings, list(sys.path))
        run_id = uuid.uuid4().hex[:12]
        with ThreadPoolExecutor(jobs, thread_name_prefix="openenv-spark") as threads:
            counter = iter(range(1 << 62))

            async def start() -> _JobSlot:
                return _JobSlot(sc, threads, header, f"openenv-{run_id}-{next(counter)}")

            await serve(dispatcher, start, jobs, 1)
        return finish(results, tasks)


class _JobSlot:
    """Plays one parcel at a time, each as a Spark job of one partition."""

    def __init__(
        self, sc: SparkContext, threads: ThreadPoolExecutor, header: tuple[Any, ...], group: str
    ) -> None:
        self.sc = sc
        self.died = asyncio.Event()
        self._threads = threads
        self._header = header
        self._group = group

    async def play(self, parcel: Parcel) -> bytes:
        def submit() -> bytes:
            self.sc.setJobGroup(self._group, "openenv episode", interruptOnCancel=True)
            rdd = self.sc.parallelize([(*self._header, parcel)], 1)
            data: list[bytes] = self.sc.runJob(rdd, _play_partition, [0])
            return data[0]

        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._threads, submit)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.abort()
            raise
        except Exception as exc:  # the job failed: a crashed Python worker, a lost executor
            raise WorkerLost(f"the Spark job failed: {_reason(exc)}", sent=True) from exc

    async def finish(self) -> None:
        pass

    def rest(self) -> None:
        pass  # each job closes its sessions when it ends

    def abort(self) -> None:
        self.died.set()
        with contextlib.suppress(Exception):
            self.sc.cancelJobGroup(self._group)


def _reason(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    text = str(java.getMessage()) if java is not None else str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in lines:  # Spark's cause, not py4j's "An error occurred while calling..."
        if "Python worker exited" in line or "Job aborted" in line:
            return line[:300]
    return lines[0][:300] if lines else type(exc).__name__


def _play_partition(items: Iterable[tuple[Any, ...]]) -> Iterator[bytes]:
    """The partition function: play the one parcel; its encoded result."""
    from pyspark import TaskContext

    context = TaskContext.get()
    retried = context.attemptNumber() if context is not None else 0  # Spark's own retries
    out: list[bytes] = []
    for settings, sys_path, parcel in items:
        worker = EpisodeWorker()
        worker.begin(settings, sys_path)
        out.append(run_coroutine(_play_one(worker, parcel, retried)))
    return iter(out)


async def _play_one(worker: EpisodeWorker, parcel: Parcel, retried: int) -> bytes:
    try:
        return await worker.play(parcel, extra_attempts=retried)
    finally:
        await worker.end()


def context(config: RunConfig) -> SparkContext:
    """The active SparkContext, or a new one as ``config`` says."""
    if SparkContext._active_spark_context is not None:
        return SparkContext.getOrCreate()
    if config.in_local:
        return local_context(config.worker_num, config.engine_options)
    conf = SparkConf().setAll([(k, str(v)) for k, v in config.engine_options.items()])
    if not conf.contains("spark.master"):
        raise EngineError(
            "no Spark master is configured: run under spark-submit, pass "
            "engine_options={'spark.master': ...}, or use in_local=True for local[worker_num]"
        )
    conf.setIfMissing("spark.app.name", "openenv")
    return SparkContext.getOrCreate(conf)


def local_context(worker_num: int, options: dict[str, Any] | None = None) -> SparkContext:
    """Start ``local[worker_num]`` Spark on loopback, quietly, with this Python for workers."""
    # Read when the JVM and the Python workers start: bind to loopback, and
    # make workers run this interpreter (with openenv), not whatever python3 is on PATH.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = (
        SparkConf()
        .setMaster(f"local[{worker_num}]")
        .setAppName("openenv")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_LOG_CONFIG}")
        .setAll([(k, str(v)) for k, v in (options or {}).items()])
    )
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    return sc
