"""``SparkRuntime``: Spark tasks that call back to the driver, fed one episode at a time."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pyspark import SparkConf, SparkContext

from openenv.errors import EngineError
from openenv.runtime.base import BatchSettings, ResultCallback, RuntimeEngine, collect, finish
from openenv.runtime.channel import CalledBackWorker, Switchboard, call_back, called_in
from openenv.runtime.config import RunConfig
from openenv.runtime.dispatch import Dispatcher, serve
from openenv.runtime.episode import run_coroutine
from openenv.runtime.shipping import pack_tasks
from openenv.runtime.task import Task, TaskResult

__all__ = ["SparkRuntime", "context", "local_context"]

_LOG_CONFIG = Path(__file__).with_name("spark-log4j2.properties")


class SparkRuntime(RuntimeEngine):
    """Runs tasks on ``worker_num`` Spark tasks, each with ``max_concurrency`` episodes in flight.

    Each worker is a Spark job of one partition whose Python worker calls
    back to the driver (a TCP connection to the address executors reach the
    driver at, opened with a random token of the run) and plays the tasks
    the driver hands it, the next one whenever one of its episodes ends;
    each result comes back the moment it is in. A lost worker (its Python
    worker crashed, its executor gone) is replaced by a new job, and the
    episodes it was playing go to another worker; finished ones are never
    played again. Spark's own retry of such a partition plays nothing: the
    driver has already handed its episodes on. Spark reuses its Python
    workers between jobs, so later runs in this program start at once.

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
        workers = 1 if settings.sequence_dependent else min(self.config.worker_num, len(tasks))
        sys_path = list(sys.path)
        run_id = uuid.uuid4().hex[:12]
        numbers = itertools.count()
        async with Switchboard(_driver_host(sc)) as board:

            async def start() -> _SparkWorker:
                number = next(numbers)
                accepted = board.expect(number)
                job = _Job(sc, f"openenv-{run_id}-{number}", (*board.address, board.token, number))
                reader, writer = await called_in(accepted, job.outcome, job.cancel)
                worker = _SparkWorker(reader, writer, job)
                worker.begin(settings, sys_path)
                return worker

            await serve(dispatcher, start, workers, settings.max_concurrency)
        return finish(results, tasks)


def _driver_host(sc: SparkContext) -> str:
    master = sc.master or ""
    if master.startswith("local"):
        return "127.0.0.1"
    return sc.getConf().get("spark.driver.host") or "127.0.0.1"


class _Job:
    """One worker's Spark job, running on a thread of its own until its partition returns."""

    def __init__(self, sc: SparkContext, group: str, payload: tuple[Any, ...]) -> None:
        self.sc = sc
        self.group = group
        loop = asyncio.get_running_loop()
        self.outcome: asyncio.Future[str] = loop.create_future()

        def submit() -> None:
            try:
                sc.setJobGroup(group, "openenv worker", interruptOnCancel=True)
                sc.runJob(sc.parallelize([payload], 1), _work_partition, [0])
                reason = "the Spark job ended"
            except Exception as exc:  # a crashed Python worker, a lost executor, a cancel
                reason = f"the Spark job failed: {_reason(exc)}"
            with contextlib.suppress(RuntimeError):  # the run's loop closed meanwhile
                loop.call_soon_threadsafe(_settle, self.outcome, reason)

        threading.Thread(target=submit, name=f"openenv-{group}", daemon=True).start()

    def cancel(self) -> None:
        with contextlib.suppress(Exception):
            self.sc.cancelJobGroup(self.group)


def _settle(future: asyncio.Future[str], reason: str) -> None:
    if not future.done():
        future.set_result(reason)


class _SparkWorker(CalledBackWorker):
    """A Spark worker's connection back to the driver."""

    what = "the Spark worker"

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, job: _Job
    ) -> None:
        self.job = job
        super().__init__(reader, writer, job.outcome)

    def _stop(self) -> None:
        self.job.cancel()


def _reason(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    text = str(java.getMessage()) if java is not None else str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in lines:  # Spark's cause, not py4j's "An error occurred while calling..."
        if "Python worker exited" in line or "Job aborted" in line:
            return line[:300]
    return lines[0][:300] if lines else type(exc).__name__


def _work_partition(items: Iterable[tuple[Any, ...]]) -> Iterator[None]:
    """The partition function: call the driver back, and play what it hands over."""
    from pyspark import TaskContext

    spark_task = TaskContext.get()
    if spark_task is not None and spark_task.attemptNumber() > 0:
        return iter(())  # Spark's own retry: the driver already gave this worker's work on
    for host, port, token, number in items:
        run_coroutine(call_back(host, port, token, number))
    return iter(())


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
