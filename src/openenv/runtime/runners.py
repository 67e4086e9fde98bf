"""``Runners`` and ``exec_tasks``: run tasks on the engine a ``RunConfig`` names.

Results come back all at once (``run_task``, ``sync_run_task``,
``exec_tasks``) or one by one as they finish (``stream``, ``sync_stream``);
``run`` and ``sync_run`` play a single input with an agent.
The names and keywords are AWorld's too: ``Runners.sync_run_task(task=...,
run_conf=...)`` and ``exec_tasks(tasks=..., run_conf=...)`` work as written
there, from plain code as from ``async`` code.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from openenv.client import ServerPool
from openenv.errors import EngineError
from openenv.runtime import recording
from openenv.runtime.base import ResultCallback, engine_class
from openenv.runtime.config import RunConfig
from openenv.runtime.episode import run_coroutine
from openenv.runtime.progress import ProgressDisplay
from openenv.runtime.task import EnvFactory, Task, TaskResult, TaskResults

__all__ = ["Runners", "exec_tasks", "sync_exec_tasks"]

_T = TypeVar("_T")


def _task_list(tasks: Task | Iterable[Task] | None) -> list[Task]:
    if tasks is None:
        raise TypeError("no tasks given: pass task=... (a Task or a list of them)")
    return [tasks] if isinstance(tasks, Task) else list(tasks)


async def _execute(
    tasks: list[Task], config: RunConfig, on_result: ResultCallback | None = None
) -> TaskResults:
    duplicates = sorted(i for i, n in Counter(t.id for t in tasks).items() if n > 1)
    if duplicates:
        raise ValueError(f"task ids must be unique; repeated: {', '.join(duplicates[:5])}")
    if not tasks:
        return TaskResults()
    if config.record is not None:
        recording.check_folder(config.record)
    cls = engine_class(config)
    engine = cls(config)
    reported = [False] * len(tasks)
    with ProgressDisplay(len(tasks), config.progress) as progress:

        def report(index: int, result: TaskResult) -> None:
            if not reported[index]:
                reported[index] = True
                progress.update(result)
                if on_result is not None:
                    on_result(index, result)

        results = await engine.run(tasks, report)
        _check(cls, tasks, results)
        for index, result in enumerate(results):
            report(index, result)
    return TaskResults(results)


async def _exec_tasks(tasks: list[Task], config: RunConfig) -> TaskResults:
    return await _execute(tasks, config)


def exec_tasks(tasks: Task | Iterable[Task], run_conf: RunConfig | None = None) -> Any:
    """Run tasks on the configured engine; one ``TaskResult`` per task, in input order.

    The results are a ``TaskResults``: a list that is also keyed by task id,
    as AWorld's dict of them (``results[task.id].answer``).

    In ``async`` code, await it: ``results = await exec_tasks(tasks, conf)``.
    Called from plain code (no event loop running), it runs the tasks and
    returns the results directly, as AWorld's ``exec_tasks(tasks=...,
    run_conf=...)`` is often written; ``sync_exec_tasks`` always does.

    A task's failure (the agent raising, its timeout, a connection failing
    after every retry, its worker lost too often) is that task's ``error``
    or ``timeout`` result; it never aborts the run or hides another task's
    result.

    Raises:
        ValueError: Two tasks share an ``id``, or ``record`` names a folder
            that cannot be written to (checked before any task starts).
        TypeError: A task cannot be pickled for a process, Ray or Spark engine.
        EngineError: The engine's extra is not installed, or the engine broke
            its contract (a custom ``cls`` returning the wrong results).

    >>> from openenv.runtime import Task
    >>> from echo_env.server.environment import EchoEnvironment
    >>> async def hi(session):
    ...     await session.reset()
    ...     return (await session.step({"message": "hi"})).observation.echoed_message
    >>> [r.value for r in exec_tasks(tasks=[Task(id="t0", env=EchoEnvironment, agent=hi)])]
    ['hi']
    """
    coro = _exec_tasks(_task_list(tasks), run_conf or RunConfig())
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_coroutine(coro)
    return coro


def sync_exec_tasks(tasks: Task | Iterable[Task], run_conf: RunConfig | None = None) -> TaskResults:
    """``exec_tasks``, blocking until every task is done; see ``Runners.sync_run_task``."""
    return _blocking(_exec_tasks(_task_list(tasks), run_conf or RunConfig()))


def _blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_coroutine(coro)
    # A loop is running here (a notebook, an async caller): the run gets a loop
    # of its own on a helper thread. Interrupted while waiting for it (Ctrl-C),
    # cancel the run there and wait for it to stop its workers before raising;
    # otherwise the interrupt waited for the whole run to finish.
    started: Future[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = Future()

    async def main() -> _T:
        current = asyncio.current_task()
        assert current is not None
        started.set_result((asyncio.get_running_loop(), current))
        return await coro

    with ThreadPoolExecutor(1, thread_name_prefix="openenv-runner") as pool:
        future = pool.submit(run_coroutine, main())
        try:
            return future.result()
        except BaseException:
            if not future.done():
                loop, task = started.result()
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(task.cancel)
            raise


def _check(cls: type, tasks: list[Task], results: object) -> None:
    name = f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(results, list) or len(results) != len(tasks):
        got = len(results) if isinstance(results, list) else type(results).__name__
        raise EngineError(
            f"engine {name} returned {got} results for {len(tasks)} tasks; "
            f"it must return a list with one TaskResult per task, in input order"
        )
    for task, result in zip(tasks, results, strict=True):
        if not isinstance(result, TaskResult) or result.task_id != task.id:
            found = getattr(result, "task_id", type(result).__name__)
            raise EngineError(
                f"engine {name} returned {found!r} where the result of task {task.id!r} "
                f"belongs; results must be TaskResults in input order"
            )


class Runners:
    """Run many episodes, on any engine, with one ``RunConfig``.

    >>> from openenv.runtime import Runners, RunConfig, Task
    >>> from echo_env.server.environment import EchoEnvironment
    >>> async def say_hi(session):
    ...     await session.reset()
    ...     result = await session.step({"message": "hi"})
    ...     return result.observation.echoed_message
    >>> tasks = [Task(id=f"t{i}", env=EchoEnvironment, agent=say_hi) for i in range(3)]
    >>> results = Runners.sync_run_task(task=tasks, run_conf=RunConfig(max_concurrency=2))
    >>> [(r.task_id, r.status.value, r.value, r.steps) for r in results]
    [('t0', 'ok', 'hi', 1), ('t1', 'ok', 'hi', 1), ('t2', 'ok', 'hi', 1)]
    >>> sorted(r.task_id for r in Runners.sync_stream(tasks))  # as they finish
    ['t0', 't1', 't2']
    """

    @staticmethod
    async def run_task(
        task: Task | Iterable[Task] | None = None,
        run_conf: RunConfig | None = None,
        *,
        tasks: Task | Iterable[Task] | None = None,
    ) -> TaskResults:
        """Run a task or a list of them; see ``exec_tasks``. ``tasks=`` is accepted too."""
        return await _exec_tasks(_task_list(task if task is not None else tasks), _conf(run_conf))

    @staticmethod
    def sync_run_task(
        task: Task | Iterable[Task] | None = None,
        run_conf: RunConfig | None = None,
        *,
        tasks: Task | Iterable[Task] | None = None,
    ) -> TaskResults:
        """Run tasks and block until all are done; works inside a running event loop too.

        Inside a running loop (a notebook, an async test) the run gets its own
        loop on a helper thread; the calling loop is blocked until it finishes.
        """
        batch = _task_list(task if task is not None else tasks)
        return _blocking(_exec_tasks(batch, _conf(run_conf)))

    @staticmethod
    async def run(
        input: Any,
        agent: Any = None,
        swarm: Any = None,
        tool_names: Iterable[str] | None = (),
        session_id: str | None = None,
        run_conf: RunConfig | None = None,
        *,
        env: str | ServerPool | EnvFactory | None = None,
    ) -> TaskResult:
        """Play one task of ``input`` with ``agent``, as AWorld's ``Runners.run``; its result.

        ``env`` (not in AWorld) gives the agent an environment. AWorld's
        ``swarm``, ``tool_names`` and ``session_id`` name things of AWorld's
        that have no counterpart here, so passing any of them is an error.

        >>> async def shout(session):
        ...     return session.input.upper()
        >>> Runners.sync_run(input="who are you?", agent=shout).answer
        'WHO ARE YOU?'
        """
        task = _one_task(input, agent, swarm, tool_names, session_id, env)
        return (await _exec_tasks([task], _conf(run_conf)))[0]

    @staticmethod
    def sync_run(
        input: Any,
        agent: Any = None,
        swarm: Any = None,
        tool_names: Iterable[str] | None = (),
        session_id: str | None = None,
        run_conf: RunConfig | None = None,
        *,
        env: str | ServerPool | EnvFactory | None = None,
    ) -> TaskResult:
        """``run``, blocking until the task is done; works inside a running event loop too."""
        return _blocking(
            Runners.run(input, agent, swarm, tool_names, session_id, run_conf, env=env)
        )

    @staticmethod
    async def stream(
        tasks: Task | Iterable[Task], run_conf: RunConfig | None = None
    ) -> AsyncIterator[TaskResult]:
        """Each task's result as soon as it is in, in the order they finish.

        Every task yields exactly one result. Leaving the loop early (``break``)
        cancels the tasks still running.

        >>> import asyncio
        >>> from openenv.runtime import Task
        >>> from echo_env.server.environment import EchoEnvironment
        >>> async def hi(session):
        ...     await session.reset()
        ...     return (await session.step({"message": "hi"})).observation.echoed_message
        >>> async def main():
        ...     tasks = [Task(id=f"t{i}", env=EchoEnvironment, agent=hi) for i in range(2)]
        ...     return sorted([r.task_id async for r in Runners.stream(tasks)])
        >>> asyncio.run(main())
        ['t0', 't1']
        """
        batch = _task_list(tasks)
        arrived: asyncio.Queue[TaskResult] = asyncio.Queue()
        run = asyncio.create_task(
            _execute(batch, _conf(run_conf), lambda _, result: arrived.put_nowait(result))
        )
        try:
            for _ in batch:
                getter = asyncio.ensure_future(arrived.get())
                await asyncio.wait({getter, run}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    await run  # the run failed before this result: raise its error
                    getter = asyncio.ensure_future(arrived.get())
                yield await getter
            await run  # an engine broken after its results: raise its error
        finally:
            if not run.done():
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run

    @staticmethod
    def sync_stream(
        tasks: Task | Iterable[Task], run_conf: RunConfig | None = None
    ) -> Iterator[TaskResult]:
        """``stream`` for plain code: a blocking iterator of results as they finish.

        The run goes on a helper thread with its own event loop; leaving the
        loop early cancels the tasks still running.
        """
        batch = _task_list(tasks)
        out: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        handle: Future[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = Future()

        async def pump() -> None:
            current = asyncio.current_task()
            assert current is not None
            handle.set_result((asyncio.get_running_loop(), current))
            try:
                async for result in Runners.stream(batch, run_conf):
                    out.put(("result", result))
            except asyncio.CancelledError:
                pass
            except BaseException as exc:
                out.put(("error", exc))
                return
            out.put(("end", None))

        thread = threading.Thread(
            target=run_coroutine, args=(pump(),), name="openenv-stream", daemon=True
        )
        thread.start()
        try:
            while True:
                kind, value = out.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            loop, task = handle.result()
            if thread.is_alive():
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(task.cancel)
            thread.join()


def _conf(run_conf: RunConfig | None) -> RunConfig:
    return run_conf or RunConfig()


def _one_task(
    input: Any,
    agent: Any,
    swarm: Any,
    tool_names: Iterable[str] | None,
    session_id: str | None,
    env: str | ServerPool | EnvFactory | None,
) -> Task:
    # AWorld's own checks and messages first, so its users see what they know.
    if agent is not None and swarm is not None:
        raise ValueError("`agent` and `swarm` only choose one.")
    if not input:
        raise ValueError("`input` is empty.")
    if swarm is not None:
        raise TypeError(
            "AWorld's Swarm has no counterpart here: pass agent=..., an `async def "
            "agent(session)` or an act() agent (ParallelizableAgent plays several at once)"
        )
    if tool_names is None:  # none given, as swarm=None and session_id=None say
        tool_names = ()
    if not isinstance(tool_names, Iterable):  # list() would raise a bare TypeError
        raise TypeError(f"tool_names must be a list of tool names, not {type(tool_names).__name__}")
    if list(tool_names):
        raise ValueError(
            "tool_names names AWorld's tools, which do not exist here: give the task an "
            "environment (env=...) and call its tools through the session"
        )
    if session_id is not None:
        raise ValueError(
            "session_id keys AWorld's memory between runs, which does not exist here: "
            "an agent keeps its own state"
        )
    return Task(input=input, agent=agent, env=env)
