"""``SparkRuntime``: one partition per share, each playing its episodes on one event loop."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pyspark import SparkConf, SparkContext

from openenv.errors import EngineError
from openenv.runtime.base import (
    BatchSettings,
    ResultCallback,
    RuntimeEngine,
    collect,
    failed_result,
    finish,
    split,
)
from openenv.runtime.config import RunConfig
from openenv.runtime.shipping import Batch, decode_results, pack, run_packed
from openenv.runtime.task import Task, TaskResult

__all__ = ["SparkRuntime", "context", "local_context"]

_LOG_CONFIG = Path(__file__).with_name("spark-log4j2.properties")


class SparkRuntime(RuntimeEngine):
    """Runs tasks in ``worker_num`` Spark partitions via ``mapPartitions``.

    Each partition runs one event loop and one client pool for all of its
    episodes. Every partition is its own Spark job, submitted concurrently,
    so one partition's crash costs only its own tasks (as ``error`` results)
    and results arrive partition by partition. The context is the active
    one, else ``local[worker_num]`` when ``in_local``, else the master that
    Spark is configured with (``spark-submit``, or ``engine_options``).
    """

    async def run(self, tasks: Sequence[Task], on_result: ResultCallback) -> list[TaskResult]:
        sc = await asyncio.to_thread(context, self.config)
        settings = BatchSettings.from_config(self.config)
        results, record = collect(tasks, on_result)
        items = list(enumerate(tasks))
        shares = [items] if settings.sequence_dependent else split(items, self.config.worker_num)
        batches = []
        for share in shares:
            batch, unsendable = pack(share, settings)
            for index, result in unsendable:
                record(index, result)
            batches.append(batch)
        rdd = sc.parallelize(batches, numSlices=len(batches))
        group = f"openenv-{uuid.uuid4().hex[:12]}"
        try:
            await asyncio.gather(
                *(_run_partition(sc, rdd, p, b, group, record) for p, b in enumerate(batches))
            )
        except asyncio.CancelledError:
            sc.cancelJobGroup(group)
            raise
        return finish(results, tasks)


async def _run_partition(
    sc: SparkContext, rdd: Any, partition: int, batch: Batch, group: str, record: ResultCallback
) -> None:
    started = time.time()
    seen: set[int] = set()
    failure: Exception | None = None

    def submit() -> list[bytes]:
        sc.setJobGroup(group, "openenv episodes", interruptOnCancel=True)
        chunks: list[bytes] = sc.runJob(rdd, _play_partition, [partition])
        return chunks

    try:
        for data in await asyncio.to_thread(submit):
            for index, result in decode_results(data):
                seen.add(index)
                record(index, result)
    except Exception as exc:  # the Spark job failed: a crashed Python worker, a lost executor
        failure = exc
    kind = type(failure).__name__ if failure else "WorkerError"
    reason = str(failure).strip().splitlines()[0] if failure else "no result"
    message = f"the Spark partition ended before finishing this task: {reason}"
    for index, task_id in zip(batch.indices, batch.ids, strict=True):
        if index not in seen:
            record(index, failed_result(task_id, kind, message, started))


def _play_partition(batches: Iterable[Batch]) -> Iterator[bytes]:
    """The partition function: run the partition's batch; one pickled result per item."""
    out: list[bytes] = []
    for batch in batches:
        run_packed(batch, out.append)
    return iter(out)


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
