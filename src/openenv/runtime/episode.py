"""Run tasks on one event loop: the core that every engine runs in its workers.

``run_batch`` plays a share of tasks with at most ``max_concurrency`` in
flight (or one after another when ``sequence_dependent``), through one
``ClientPool``; ``run_one`` turns one task into exactly one ``TaskResult``,
whatever happens: the agent raising, the task's deadline passing, or the
connection failing after every retry.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from openenv.errors import CapacityError, ConnectionFailedError, SessionClosedError
from openenv.runtime import recording
from openenv.runtime.agents import drive
from openenv.runtime.base import BatchSettings, ResultCallback
from openenv.runtime.pool import ClientPool
from openenv.runtime.recording import EpisodeRecord
from openenv.runtime.session import EpisodeSession
from openenv.runtime.task import Task, TaskError, TaskResult, TaskStatus

__all__ = ["RETRYABLE", "run_batch", "run_coroutine", "run_one", "time_limit", "timeout_error"]

_T = TypeVar("_T")

# Connection-level failures: the episode never reached the environment, or
# lost it. Worth another attempt on a fresh session; nothing else is.
RETRYABLE: tuple[type[Exception], ...] = (ConnectionFailedError, CapacityError, SessionClosedError)

_MAX_BACKOFF = 10.0


async def run_batch(
    items: Sequence[tuple[int, Task]], settings: BatchSettings, on_result: ResultCallback
) -> None:
    """Run ``(index, task)`` pairs; report each result as ``on_result(index, result)``."""
    pool = ClientPool(settings.max_concurrency, multiplex=settings.multiplex)
    try:
        if settings.sequence_dependent:
            previous: TaskResult | None = None
            for index, task in items:
                previous = await run_one(task, settings, pool, previous)
                on_result(index, previous)
            return
        pending = iter(items)

        async def worker() -> None:
            # Workers share one iterator: each takes the next task when it is free.
            for index, task in pending:
                on_result(index, await run_one(task, settings, pool))

        await asyncio.gather(*(worker() for _ in range(min(settings.max_concurrency, len(items)))))
    finally:
        await pool.aclose()
        if settings.record is not None:
            recording.flush()


class _Attempts:
    """What the task did so far, across its attempts."""

    def __init__(self, before: int = 0, free: int = 0) -> None:
        self.started_at = time.time()
        self.count = before
        self.free = free  # attempts that do not count against the retries
        self.session: EpisodeSession | None = None

    def result(
        self,
        task: Task,
        status: TaskStatus,
        value: Any = None,
        error: TaskError | None = None,
    ) -> TaskResult:
        session = self.session
        return TaskResult(
            task_id=task.id,
            status=status,
            value=value,
            reward=session.total_reward if session else 0.0,
            steps=session.steps if session else 0,
            error=error,
            started_at=self.started_at,
            ended_at=time.time(),
            attempts=max(self.count, 1),
        )


def time_limit(task: Task, settings: BatchSettings) -> float | None:
    """The seconds ``task`` may take in all: its own ``timeout``, else the run's."""
    return task.timeout if task.timeout is not None else settings.timeout


async def run_one(
    task: Task,
    settings: BatchSettings,
    pool: ClientPool,
    previous: TaskResult | None = None,
    *,
    attempts_before: int = 0,
    free_attempts: int = 0,
    time_left: float | None = None,
) -> TaskResult:
    """Play one task to exactly one result; never raises for the task's own failures.

    A task re-dispatched after its worker was lost passes the attempts it
    already used (they count against ``retries``, but for ``free_attempts``
    of them: lost when the driver stopped a worker for another task's sake)
    and the time left of its timeout (``None``: all of it).
    """
    attempts = _Attempts(attempts_before, free_attempts)
    limit = time_limit(task, settings)
    deadline = asyncio.timeout(time_left if time_left is not None else limit)
    try:
        async with deadline:
            value = await _with_retries(task, settings, pool, previous, attempts)
    except TimeoutError as exc:
        if not deadline.expired():  # the agent's own TimeoutError, not the deadline
            return attempts.result(task, TaskStatus.ERROR, error=TaskError.from_exception(exc))
        return attempts.result(task, TaskStatus.TIMEOUT, error=timeout_error(task, limit))
    except asyncio.CancelledError as exc:
        current = asyncio.current_task()
        if current is None or current.cancelling():
            raise  # the run itself is being cancelled
        # The agent's own (it awaited a task that it or a library cancelled):
        # its task's failure. Raised on, it left the task without a result on
        # a worker (the run waited for ever) and ended an in-process run.
        return attempts.result(task, TaskStatus.ERROR, error=TaskError.from_exception(exc))
    except (Exception, SystemExit) as exc:
        # SystemExit too (an agent's or its library's sys.exit()): it is the
        # task's failure; raised on, it would end the run, or kill the worker.
        return attempts.result(task, TaskStatus.ERROR, error=TaskError.from_exception(exc))
    return attempts.result(task, TaskStatus.OK, value=value)


def timeout_error(task: Task, limit: float | None) -> TaskError:
    """The error of a task that ran out of time."""
    message = f"task {task.id!r} did not finish within its {limit or 0:g} s timeout"
    return TaskError("TimeoutError", message)


async def _with_retries(
    task: Task,
    settings: BatchSettings,
    pool: ClientPool,
    previous: TaskResult | None,
    attempts: _Attempts,
) -> Any:
    while True:
        attempts.count += 1
        try:
            return await _attempt(task, settings, pool, previous, attempts)
        except RETRYABLE:
            if attempts.count - attempts.free > settings.retries:
                raise
        delay = min(_MAX_BACKOFF, settings.retry_backoff * 2 ** (attempts.count - 1))
        await asyncio.sleep(delay * random.uniform(0.5, 1.0))  # jitter spreads out reconnects


async def _attempt(
    task: Task,
    settings: BatchSettings,
    pool: ClientPool,
    previous: TaskResult | None,
    attempts: _Attempts,
) -> Any:
    client, reused = await pool.acquire(task)
    while True:
        record = _record(task, settings, attempts.count)
        session = attempts.session = EpisodeSession(task, client, previous, pool, record)
        reason = "ok"
        try:
            return await drive(task.agent, session)
        except RETRYABLE as exc:
            reason = type(exc).__name__
            if not (reused and session.requests == 0):
                raise
            # A kept session that the server has since closed (idle timeout,
            # restart): the episode never started, so try a fresh one at once.
        except BaseException as exc:  # the agent's error, the deadline's cancellation
            reason = recording.ended_by(exc)
            raise
        finally:
            try:
                if record is not None and session.requests:
                    record.close(reason)  # may raise (the disk): the client goes back anyway
            finally:
                pool.release(task, client, reusable=reason == "ok")
        client, reused = await pool.acquire(task, fresh=True)


def _record(task: Task, settings: BatchSettings, attempt: int) -> EpisodeRecord | None:
    if settings.record is None:
        return None
    session = task.id if attempt <= 1 else f"{task.id}/attempt-{attempt}"
    return EpisodeRecord(settings.record, session, task.id)


def run_coroutine(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine on a new event loop (uvloop's where installed); for workers.

    It returns without waiting for threads of the loop's default executor
    (``asyncio.to_thread``) still running: a blocking call past its task's
    timeout cannot be stopped, and its answer is dropped.
    """
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        # Runner.close waits for the default executor's threads with no bound
        # (Python 3.11): a to_thread call stuck past its task's timeout held the
        # run, and a worker process whose driver was gone, until it returned.
        runner.get_loop().set_default_executor(_UnwaitedExecutor(thread_name_prefix="asyncio"))
        return runner.run(coro)


class _UnwaitedExecutor(ThreadPoolExecutor):
    """A loop's default executor whose shutdown never waits for its threads.

    The loop shuts it down as it closes, once every task is done: nothing
    awaits a call still running or queued then, so the queued ones are
    dropped and the running ones left to finish on their own.
    """

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=True)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # an optional speed-up; asyncio's loop behaves the same
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
