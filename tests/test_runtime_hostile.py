"""Runners against agents and environments that misbehave: each costs its own task only.

An agent whose sync ``act()``, or an in-process environment whose ``def``
method, blocks past its task's timeout keeps its thread (Python cannot stop
it), but no later episode may wait behind that thread; an
agent that calls ``sys.exit()`` is that task's error, not the end of the run
or of a worker. Nor may a blocking call an agent put in ``asyncio.to_thread``
hold up the end of a run, or keep a worker process whose driver is gone.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from runtime_agents import (
    BlockingActor,
    Shouter,
    answer_agent,
    blocking_async_agent,
    echo_agent,
    thread_stuck_agent,
)

from echo_env.models import EchoAction
from echo_env.server.environment import EchoEnvironment
from openenv.runtime import EpisodeSession, ParallelizableAgent, RunConfig, Runners, Task
from openenv.runtime.base import BatchSettings
from openenv.runtime.channel import frame
from openenv.runtime.shipping import Parcel, pack_tasks

ENGINES = {
    "local": {"worker_num": 1},
    "processes": {"worker_num": 2},
}
EVERY = {
    **ENGINES,
    "ray": {"engine_name": "ray", "worker_num": 2},
    "spark": {"engine_name": "spark", "worker_num": 2},
}
# Generous: an echo episode takes milliseconds; the bound only ends a stalled test.
SLACK = 30


def engine(request: pytest.FixtureRequest, name: str) -> dict[str, Any]:
    """The engine's options; a Ray cluster or Spark context started for it."""
    if name in ("ray", "spark"):
        request.getfixturevalue("ray_cluster" if name == "ray" else "spark_context")
    return EVERY[name]


def echo_task(task_id: str, agent: Any, **options: Any) -> Task:
    env = functools.partial(EchoEnvironment, max_steps=3)
    return Task(id=task_id, env=env, agent=agent, **options)


@pytest.mark.parametrize("name", list(ENGINES))
def test_a_sync_act_stuck_past_its_timeout_holds_up_no_later_episode(name: str) -> None:
    # One slot, one thread: the blocker's. Later act() calls must get a thread
    # of their own, not queue behind it. (In order, so that on processes they
    # all follow the blocker on its one worker.)
    tasks = [
        echo_task("blocker", BlockingActor(), timeout=0.5),
        *(echo_task(f"t{i}", Shouter(), timeout=SLACK) for i in range(6)),
    ]
    config = RunConfig(**ENGINES[name], max_concurrency=1, sequence_dependent=True, progress=False)
    results = Runners.sync_run_task(tasks, config)
    assert [r.status.value for r in results] == ["timeout"] + ["ok"] * 6, [r.error for r in results]


class HeldActor:
    """A sync ``act()`` that blocks its thread until the test releases it."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def act(self, observation: Any) -> EchoAction:
        self.release.wait(4 * SLACK)  # past the other tasks' timeout
        return EchoAction(message="late")


def only(results: dict[str, Any]) -> Any:
    (action,) = results.values()
    return action


def test_sync_sub_agents_stuck_past_their_timeout_hold_up_no_later_episode() -> None:
    # More stuck sub-agents than a loop's default executor has threads.
    stuck = min(32, (os.cpu_count() or 1) + 4)
    release = threading.Event()
    try:
        tasks = [
            *(
                echo_task(f"b{i}", ParallelizableAgent([HeldActor(release)], only), timeout=0.2)
                for i in range(stuck)
            ),
            *(
                echo_task(f"t{i}", ParallelizableAgent([Shouter()], only), timeout=SLACK)
                for i in range(3)
            ),
        ]
        results = Runners.sync_run_task(tasks, RunConfig(max_concurrency=1, progress=False))
    finally:
        release.set()
    statuses = [r.status.value for r in results]
    assert statuses == ["timeout"] * stuck + ["ok"] * 3, [r.error for r in results]


class StuckEcho(EchoEnvironment):
    """An environment whose ``def step`` blocks its thread until the test releases it."""

    release = threading.Event()

    def step(self, action: EchoAction) -> Any:
        self.release.wait(4 * SLACK)
        return super().step(action)


def test_in_process_environments_stuck_past_their_timeout_hold_up_no_later_episode() -> None:
    # More stuck steps than the old pool of environment threads had
    # (max_concurrency + 4): then no later environment could even be made.
    tasks = [
        *(Task(id=f"b{i}", env=StuckEcho, agent=echo_agent, timeout=0.2) for i in range(6)),
        *(echo_task(f"t{i}", echo_agent, timeout=SLACK) for i in range(3)),
    ]
    try:
        results = Runners.sync_run_task(tasks, RunConfig(max_concurrency=1, progress=False))
    finally:
        StuckEcho.release.set()
    statuses = [r.status.value for r in results]
    assert statuses == ["timeout"] * 6 + ["ok"] * 3, [r.error for r in results]


class ThreadHeldAgent:
    """Blocks in ``asyncio.to_thread``, as the docs advise, until the test releases it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()

    async def __call__(self, session: EpisodeSession) -> None:
        await asyncio.to_thread(self._block)

    def _block(self) -> None:
        self.entered.set()
        self.release.wait(SLACK)
        self.returned.set()


async def _run_task_inside_a_loop(tasks: list[Task], config: RunConfig) -> Any:
    return Runners.sync_run_task(tasks, config)


@pytest.mark.parametrize("call", ["sync_run_task", "sync_stream", "inside a running loop"])
def test_a_to_thread_call_stuck_past_its_timeout_does_not_hold_the_run(call: str) -> None:
    # Closing the run's loop waited for the loop's default executor, so the
    # run, its `timeout` result long known, returned only once the call did.
    agent = ThreadHeldAgent()
    tasks = [Task(id="stuck", agent=agent, timeout=0.5)]
    config = RunConfig(progress=False)
    try:
        if call == "sync_run_task":
            results = list(Runners.sync_run_task(tasks, config))
        elif call == "sync_stream":
            results = list(Runners.sync_stream(tasks, config))
        else:
            results = list(asyncio.run(_run_task_inside_a_loop(tasks, config)))
        assert agent.entered.is_set()
        assert not agent.returned.is_set()  # the run is over; the call still blocks
    finally:
        agent.release.set()
    assert [r.status.value for r in results] == ["timeout"], results


def test_a_worker_process_exits_once_its_driver_is_gone_though_an_agent_thread_blocks() -> None:
    # The worker's loop, closing, waited for the agent's to_thread call: the
    # process outlived its driver until the call returned (here: never).
    (blob,) = pack_tasks([Task(id="stuck", agent=thread_stuck_agent)])
    settings = BatchSettings.from_config(RunConfig())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "openenv.runtime.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert worker.stdin is not None
    assert worker.stderr is not None
    try:
        worker.stdin.write(frame(("begin", settings, sys.path)))
        worker.stdin.write(frame(("play", Parcel(index=0, task_id="stuck", blob=blob))))
        worker.stdin.flush()
        for line in worker.stderr:
            if b"stuck in a thread" in line:
                break
        else:
            raise AssertionError(f"the worker exited with {worker.wait()} before the agent ran")
        worker.stdin.close()  # the driver is gone
        assert worker.wait(SLACK) == 0
    finally:
        worker.kill()
        worker.wait()
        worker.stderr.close()
        if worker.stdout is not None:
            worker.stdout.close()


async def exiting_agent(session: EpisodeSession) -> None:
    await session.reset()
    sys.exit("the agent quit")


class ExitingActor:
    def act(self, observation: Any) -> EchoAction:
        raise SystemExit(4)


@pytest.mark.parametrize("name", list(EVERY))
@pytest.mark.parametrize("agent", [exiting_agent, ExitingActor()], ids=["async", "act"])
def test_an_agent_calling_sys_exit_fails_alone(
    request: pytest.FixtureRequest, name: str, agent: Any
) -> None:
    tasks = [echo_task("quitter", agent), *(echo_task(f"t{i}", echo_agent) for i in range(3))]
    options = engine(request, name)
    config = RunConfig(**options, max_concurrency=2, retry_backoff=0.01, progress=False)
    results = Runners.sync_run_task(tasks, config)
    assert [r.status.value for r in results] == ["error", "ok", "ok", "ok"]
    error = results[0].error
    assert error is not None
    assert error.type == "SystemExit"
    assert results[0].attempts == 1  # its own failure: not retried, no worker lost


class Unprintable(Exception):
    """An exception whose ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


async def unprintable_agent(session: EpisodeSession) -> None:
    await session.reset()
    raise Unprintable


@pytest.mark.parametrize("name", list(EVERY))
def test_an_exception_that_cannot_be_printed_fails_its_task_alone(
    request: pytest.FixtureRequest, name: str
) -> None:
    # It aborted the in-process run, and left its task without a result on
    # worker processes (the run waited for it for ever).
    tasks = [
        echo_task("odd", unprintable_agent),
        *(echo_task(f"t{i}", echo_agent) for i in range(3)),
    ]
    config = RunConfig(**engine(request, name), max_concurrency=2, progress=False)
    results = Runners.sync_run_task(tasks, config)
    assert [r.status.value for r in results] == ["error", "ok", "ok", "ok"]
    error = results[0].error
    assert error is not None
    assert error.type == "Unprintable"
    assert "str() of the exception failed" in error.message


@pytest.mark.parametrize("mode", ["session", "observation"])
async def test_a_failing_sub_agent_stops_its_siblings_before_its_task_ends(mode: str) -> None:
    # asyncio.gather left the sibling running past its task's result, holding
    # its session (and, in a worker process kept for the next run, its slot).
    events: list[str] = []
    sibling_waits = asyncio.Event()

    async def linger() -> None:
        events.append("started")
        sibling_waits.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    async def fail() -> None:
        await sibling_waits.wait()
        raise ValueError("this sub-agent gave up")

    async def lingers(session: EpisodeSession) -> None:
        await session.reset()
        await linger()

    async def fails(session: EpisodeSession) -> None:
        await session.reset()
        await fail()

    async def lingers_on(observation: Any) -> None:
        await linger()

    async def fails_on(observation: Any) -> None:
        await fail()

    pair = {"session": (lingers, fails), "observation": (lingers_on, fails_on)}[mode]
    agent = ParallelizableAgent(dict(zip(["lingers", "fails"], pair, strict=True)))
    config = RunConfig(progress=False)
    (result,) = await Runners.run_task([echo_task("t0", agent)], config)
    assert result.error is not None
    assert (result.error.type, result.error.message) == ("ValueError", "this sub-agent gave up")
    assert events == ["started", "cancelled"]


class MeetsTheOthers:
    """Holds its slot until ``count`` episodes are in, each in its own process; its pid."""

    def __init__(self, folder: str, count: int) -> None:
        self.folder, self.count = folder, count

    async def __call__(self, session: EpisodeSession) -> int:
        await session.reset()
        return await asyncio.to_thread(self._meet)

    def _meet(self) -> int:
        Path(self.folder, str(os.getpid())).touch()
        deadline = time.monotonic() + SLACK
        while len(os.listdir(self.folder)) < self.count and time.monotonic() < deadline:
            time.sleep(0.02)
        return os.getpid()


def test_ray_actors_that_died_between_runs_cost_the_next_run_nothing(
    ray_cluster: None, tmp_path: Path
) -> None:
    # Three actors kept for the next run die in between (their node lost, the
    # OOM killer): the next run replaces them, however few workers it wants.
    config = RunConfig(
        engine_name="ray",
        worker_num=3,
        max_concurrency=1,
        engine_options={"num_cpus": 0.1},
        progress=False,
    )
    tasks = [echo_task(f"t{i}", MeetsTheOthers(str(tmp_path), 3)) for i in range(3)]
    first = Runners.sync_run_task(tasks, config)
    pids = {r.value for r in first}
    assert len(pids) == 3, [r.error for r in first]  # one episode in each of three actors
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    later = RunConfig(
        engine_name="ray", worker_num=1, engine_options={"num_cpus": 0.1}, progress=False
    )
    results = Runners.sync_run_task([echo_task("after", echo_agent)], later)
    assert [r.status.value for r in results] == ["ok"], [r.error for r in results]


def test_one_task_on_worker_processes_times_out_though_its_agent_blocks_the_loop() -> None:
    # With one task, worker_num=2 ran it on the caller's loop, where nothing
    # can interrupt an `async def` agent that calls time.sleep: it came back
    # `ok` a minute later instead of `timeout` at its 1 s.
    tasks = [Task(id="blocker", env=EchoEnvironment, agent=blocking_async_agent, timeout=1)]
    config = RunConfig(worker_num=2, max_concurrency=1, progress=False)
    (result,) = Runners.sync_run_task(tasks, config)
    assert result.status.value == "timeout", result
    assert result.error is not None
    assert "did not finish within its 1 s timeout" in result.error.message


async def cancelled_agent(session: EpisodeSession) -> None:
    """Awaits a task it cancelled itself: asyncio.CancelledError reaches its caller."""
    await session.reset()
    sleeper = asyncio.ensure_future(asyncio.sleep(3600))
    await asyncio.sleep(0)
    sleeper.cancel()
    await sleeper


@pytest.mark.parametrize("name", ["local", "processes", "spark"])
def test_an_agent_that_raises_cancelled_error_fails_alone(
    request: pytest.FixtureRequest, name: str
) -> None:
    # On worker engines its task never got a result (the run waited for ever;
    # here the task's timeout ends it); in process it ended the whole run.
    tasks = [
        echo_task("cancelled", cancelled_agent, timeout=SLACK),
        *(echo_task(f"t{i}", echo_agent) for i in range(3)),
    ]
    config = RunConfig(**engine(request, name), max_concurrency=2, progress=False)
    results = Runners.sync_run_task(tasks, config)
    assert [r.status.value for r in results] == ["error", "ok", "ok", "ok"], results[0]
    error = results[0].error
    assert error is not None
    assert error.type == "CancelledError"
    assert results[0].attempts == 1


READS_STDIN = "import sys; data = sys.stdin.buffer.read(); print(len(data))"


async def stdin_reading_agent(session: EpisodeSession) -> str:
    """Starts a program that reads its stdin to the end, as many tools do."""
    await session.reset()
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", READS_STDIN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=SLACK,
    )
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def test_programs_an_agent_starts_in_a_worker_process_read_no_driver_messages() -> None:
    # They inherited the worker's stdin: the driver's (non-blocking) pipe of
    # messages. A reader failed on it (EAGAIN), or took frames meant for the
    # worker; they now read an empty stdin, as under a terminal-less program.
    tasks = [echo_task(f"r{i}", stdin_reading_agent) for i in range(2)]
    tasks += [echo_task(f"t{i}", echo_agent) for i in range(2)]
    config = RunConfig(worker_num=2, max_concurrency=2, progress=False)
    results = Runners.sync_run_task(tasks, config)
    assert [(r.status.value, r.value) for r in results[:2]] == [("ok", "0")] * 2, results
    assert all(r.ok for r in results[2:])


def _runs_in_a_forked_child(results: Any) -> None:
    tasks = [echo_task(f"c{i}", echo_agent) for i in range(4)]
    config = RunConfig(worker_num=2, progress=False)
    played = Runners.sync_run_task(tasks, config)
    results.put([(r.task_id, r.status.value) for r in played])


def test_a_forked_child_runs_on_worker_processes_of_its_own() -> None:
    # A child forked after the parent ran on worker processes (a fork pool, a
    # datasets map) inherits their loop without its thread: a run there would
    # wait for ever, and the parent's warm workers are not the child's to use.
    tasks = [echo_task(f"p{i}", echo_agent) for i in range(4)]
    config = RunConfig(worker_num=2, progress=False)
    assert {r.status.value for r in Runners.sync_run_task(tasks, config)} == {"ok"}
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_runs_in_a_forked_child, args=(results,))
    child.start()
    try:
        assert results.get(timeout=120) == [(f"c{i}", "ok") for i in range(4)]
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    # The parent's own workers still serve it.
    assert {r.status.value for r in Runners.sync_run_task(tasks, config)} == {"ok"}


def test_a_run_whose_workers_ray_can_never_place_ends_past_its_start_timeout(
    ray_cluster: None,
) -> None:
    # No node has the resource: Ray queues the actors for good. With start_timeout
    # the run ends, each task failed with why.
    tasks = [echo_task(f"t{i}", echo_agent) for i in range(3)]
    config = RunConfig(
        engine_name="ray",
        worker_num=2,
        engine_options={"resources": {"no_such_node": 1}},
        start_timeout=0.5,
        progress=False,
    )
    results = Runners.sync_run_task(tasks, config)
    assert [r.task_id for r in results] == ["t0", "t1", "t2"]
    for result in results:
        assert result.status.value == "error"
        assert result.error is not None
        assert "no worker started within start_timeout (0.5s)" in result.error.message


@pytest.mark.parametrize("name", ["processes", "spark"])
def test_a_start_timeout_that_is_met_changes_nothing(
    request: pytest.FixtureRequest, name: str
) -> None:
    tasks = [echo_task(f"t{i}", echo_agent) for i in range(4)]
    config = RunConfig(**engine(request, name), start_timeout=SLACK, progress=False)
    assert {r.status.value for r in Runners.sync_run_task(tasks, config)} == {"ok"}


def test_a_huge_max_concurrency_costs_worker_engines_nothing_for_a_few_tasks() -> None:
    """``max_concurrency`` as "no bound" on worker processes: the few tasks run at once.

    It made a slot coroutine per unit of ``max_concurrency``: three tasks took a
    minute and gigabytes.
    """
    tasks = [Task(id=f"t{i}", agent=answer_agent, input=i) for i in range(3)]
    config = RunConfig(worker_num=2, max_concurrency=10**6, progress=False)
    results: list[Any] = []
    done = threading.Event()

    def play() -> None:
        results.extend(Runners.sync_run_task(tasks, config))
        done.set()

    threading.Thread(target=play, daemon=True).start()
    assert done.wait(30), "three trivial tasks done within 30 s"
    assert [(r.status.value, r.value) for r in results] == [
        ("ok", f"answer to {i}") for i in range(3)
    ]
