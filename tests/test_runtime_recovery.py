"""Runners under loss and delay, on real engines: exactly one result per task.

Every agent here writes each of its invocations to a journal file (any
process can append to it), so the tests count what really ran: a worker
killed mid-run must cost no result and replay no finished episode; a slow
task must hold up only its own slot; results must reach the caller while
the run goes on; a blocking agent must time out on time without stalling
the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from runtime_agents import (
    BlockingActor,
    Journal,
    append_line,
    blocking_async_agent,
    echo_agent,
    exiting_agent,
    journal_lines,
    wait_for_file,
)

from echo_env.models import EchoAction
from echo_env.server.environment import EchoEnvironment
from openenv.runtime import EpisodeSession, RunConfig, Runners, Task, TaskResult

REMOTE = {
    "processes": {"engine_name": "local", "worker_num": 2},
    "ray": {"engine_name": "ray", "worker_num": 2},
    "spark": {"engine_name": "spark", "worker_num": 2},
}
EVERY = {"local": {"engine_name": "local", "worker_num": 1}, **REMOTE}


def engine_config(request: pytest.FixtureRequest, name: str, **options: Any) -> RunConfig:
    if name == "ray":
        request.getfixturevalue("ray_cluster")
    elif name == "spark":
        request.getfixturevalue("spark_context")
    base = {**EVERY[name], "retry_backoff": 0.01, "progress": False}
    return RunConfig(**{**base, **options})


def echo_tasks(n: int, agent: Any, **options: Any) -> list[Task]:
    env = functools.partial(EchoEnvironment, max_steps=5)
    return [Task(id=f"t{i}", env=env, agent=agent, **options) for i in range(n)]


def until(condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.02)


def done_count(journal: str) -> int:
    return sum(words[0] == "done" for words in journal_lines(journal))


@pytest.mark.parametrize("name", list(REMOTE))
def test_a_worker_killed_mid_run_loses_no_result_and_replays_no_finished_episode(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    journal = str(tmp_path / "journal")
    tasks = echo_tasks(16, Journal(journal, hold="t5"))
    config = engine_config(request, name, max_concurrency=2)
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(Runners.sync_run_task, tasks, config)
        held = Path(journal + ".held")
        until(held.exists, "held episode")
        # Other episodes finish meanwhile, on both workers; then t5's worker
        # (a process, an actor, Spark's Python worker) is killed mid-episode.
        until(lambda: done_count(journal) >= 8, "finished episodes")
        killed = int(held.read_text())
        os.kill(killed, signal.SIGKILL)
        results = run.result(timeout=300)

    lines = journal_lines(journal)
    assert [r.task_id for r in results] == [t.id for t in tasks]
    assert [r.status.value for r in results] == ["ok"] * 16, [r.error for r in results]
    done = Counter(task_id for word, task_id, _ in lines if word == "done")
    assert set(done) == {t.id for t in tasks}  # none lost
    # An episode that finished in the killed worker an instant before the kill,
    # its result not yet out of the process, is played again: that is the one
    # way to lose no result. Any other finish is never replayed.
    finished: set[str] = set()
    for word, task_id, pid in lines:
        assert not (word == "start" and task_id in finished), f"{task_id} replayed after done"
        if word == "done" and int(pid) != killed:
            finished.add(task_id)
    for task_id, count in done.items():
        if count > 1:
            first = next(int(p) for w, t, p in lines if w == "done" and t == task_id)
            assert (first, count) == (killed, 2), f"{task_id} finished {count} times"
    starts = Counter(task_id for word, task_id, _ in lines if word == "start")
    assert starts["t5"] == 2
    assert results[5].attempts == 2  # the lost attempt is counted and shown
    assert all(r.attempts >= starts[r.task_id] for r in results)


@pytest.mark.parametrize("name", ["processes", "spark"])
def test_a_task_that_kills_every_worker_it_plays_on_fails_alone(
    request: pytest.FixtureRequest, name: str
) -> None:
    # The tasks lost with it went back to the front of the queue together, were
    # handed out together again, and died with it again: 5 to 8 of these 39
    # failed with "lost its worker 3 times", though nothing was wrong with them.
    tasks = [
        Task(id="killer", env=EchoEnvironment, agent=exiting_agent),
        *echo_tasks(39, echo_agent),
    ]
    results = Runners.sync_run_task(tasks, engine_config(request, name, max_concurrency=8))
    killer = results[0]
    assert (killer.status.value, killer.attempts) == ("error", 3)
    assert killer.error is not None
    assert "lost its worker 3 times (retries=2)" in killer.error.message
    assert [r.task_id for r in results if not r.ok] == ["killer"], [r.error for r in results]
    assert all(1 <= r.attempts <= 3 for r in results)


# Longer than any test here: the test kills the child when it is done.
HELPER_LIFE = 600


def fork_child(how: str, pid_file: str) -> None:
    """Fork a child that outlives this process, and write its pid to ``pid_file``.

    ``how``: ``"multiprocessing"``, a helper process as an agent may start;
    ``"libc"``, a fork from C, as a native library may do, which runs none
    of Python's at-fork hooks.
    """
    if how == "multiprocessing":
        helper = multiprocessing.get_context("fork").Process(target=time.sleep, args=(HELPER_LIFE,))
        helper.start()
        pid = helper.pid
    else:
        pid = ctypes.PyDLL(None).fork()  # PyDLL: the child wakes holding the GIL
        if pid == 0:
            time.sleep(HELPER_LIFE)
            os._exit(0)
    Path(pid_file).write_text(str(pid))


class ForksThenDies:
    """Forks a child that outlives its worker process (``fork_child``), then kills the worker."""

    def __init__(self, pid_file: str, how: str) -> None:
        self.pid_file = pid_file
        self.how = how

    async def __call__(self, session: EpisodeSession) -> None:
        await session.reset()
        fork_child(self.how, self.pid_file)
        os._exit(1)  # as a crash would


@pytest.mark.parametrize("how", ["multiprocessing", "libc"])
async def test_a_worker_that_dies_is_noticed_though_a_child_it_forked_lives_on(
    tmp_path: Path, how: str
) -> None:
    # The driver learned of a worker's death only from the end of its stdout,
    # and the child held a copy of that pipe: the run waited for the child to
    # exit, and with a timeout it reported `timeout`, not the crash.
    pid_file = tmp_path / "child.pid"
    tasks = [
        Task(id="crasher", env=EchoEnvironment, agent=ForksThenDies(str(pid_file), how)),
        *echo_tasks(3, echo_agent),
    ]
    config = RunConfig(worker_num=2, max_concurrency=1, retries=0, timeout=30, progress=False)
    try:
        async with asyncio.timeout(60):  # a guard: the old failure never ended
            results = await Runners.run_task(tasks, config)
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert [r.status.value for r in results] == ["error", "ok", "ok", "ok"], results[0]
    assert results[0].error is not None
    assert results[0].error.message == (
        "the worker process exited with code 1; the task lost its worker 1 times (retries=0)"
    )


@pytest.mark.parametrize("name", ["ray", "spark"])
async def test_a_remote_worker_that_dies_is_noticed_though_a_child_it_forked_lives_on(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    # The child held a copy of the worker's connection to the driver, which so
    # never ended; and Ray reports no death while the child lives. With no
    # timeout, the run waited for as long as the child lived.
    pid_file = tmp_path / "child.pid"
    tasks = [
        Task(
            id="crasher", env=EchoEnvironment, agent=ForksThenDies(str(pid_file), "multiprocessing")
        ),
        *echo_tasks(3, echo_agent),
    ]
    config = engine_config(request, name, max_concurrency=1, retries=0)
    try:
        async with asyncio.timeout(120):  # a guard: the old failure never ended
            results = await Runners.run_task(tasks, config)
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert [r.status.value for r in results] == ["error", "ok", "ok", "ok"], results[0]
    assert results[0].error is not None
    assert results[0].error.message.endswith("the task lost its worker 1 times (retries=0)")


@pytest.mark.parametrize("name", list(REMOTE))
def test_workers_pull_work_as_they_free_up(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    # One slot per worker. t0 holds its slot until every other task is done:
    # they can only get done if the other worker takes them all, one after
    # another. Tasks split up front would leave half of them behind t0.
    journal = str(tmp_path / "journal")
    tasks = echo_tasks(12, Journal(journal, straggler="t0", others=11))
    results = Runners.sync_run_task(tasks, engine_config(request, name, max_concurrency=1))
    assert all(r.ok for r in results), [r.error for r in results]
    assert results[0].value is True
    done = Counter(task_id for word, task_id, _ in journal_lines(journal) if word == "done")
    assert done == {t.id: 1 for t in tasks}


@pytest.mark.parametrize("name", list(EVERY))
def test_results_reach_the_caller_while_the_run_goes_on(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    # t3 finishes only once the caller has received some other result: with
    # results handed over only at the end, it would wait out its 60 s.
    journal, gate = str(tmp_path / "journal"), tmp_path / "first-result-seen"
    tasks = echo_tasks(4, Journal(journal, gate=("t3", str(gate))))
    arrived: list[TaskResult] = []
    for result in Runners.sync_stream(tasks, engine_config(request, name, max_concurrency=4)):
        gate.touch()
        arrived.append(result)
    assert sorted(r.task_id for r in arrived) == ["t0", "t1", "t2", "t3"]
    assert next(r for r in arrived if r.task_id == "t3").value is True
    assert all(r.ok for r in arrived)


async def test_leaving_the_stream_early_cancels_what_is_still_running(tmp_path: Path) -> None:
    # t0 starts and then waits forever; t1 finishes only once t0 is waiting, so
    # the first result comes while t0 is surely running.
    journal = str(tmp_path / "journal")
    tasks = echo_tasks(2, Journal(journal, hold="t0", gate=("t1", journal + ".held")))
    config = RunConfig(max_concurrency=2, progress=False)
    async with contextlib.aclosing(Runners.stream(tasks, config)) as results:
        first = await anext(results)
    assert (first.task_id, first.value) == ("t1", True)
    words = [w[:2] for w in journal_lines(journal)]
    assert ["start", "t0"] in words
    assert ["done", "t0"] not in words  # cancelled, not waited for


# A program that calls sync_run_task from inside a running loop, as a notebook
# does, and is interrupted (Ctrl-C) while its episodes wait for ever; then it
# reports its child processes (the workers) still alive once they are gone
# (or after 30 s).
INTERRUPTED_IN_A_LOOP = """
import asyncio, os, sys, time
from pathlib import Path
from openenv.runtime import RunConfig, Runners, Task

held = Path(sys.argv[1])

async def hang(session):
    held.write_text(str(os.getpid()))
    await asyncio.Event().wait()

def children():
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if entry.isdigit() and int(stat.rpartition(")")[2].split()[1]) == os.getpid():
            found.append(int(entry))
    return found

async def main():
    tasks = [Task(id=f"t{i}", agent=hang) for i in range(4)]
    try:
        Runners.sync_run_task(tasks, RunConfig(worker_num=2, progress=False))
    except KeyboardInterrupt:
        print("interrupted", flush=True)

asyncio.new_event_loop().run_until_complete(main())
deadline = time.monotonic() + 30
while children() and time.monotonic() < deadline:
    time.sleep(0.02)
print("left", children(), flush=True)
"""


def test_ctrl_c_in_sync_run_task_inside_a_loop_stops_the_run_and_its_workers(
    tmp_path: Path,
) -> None:
    # The interrupt waited for the whole run to end (here: for ever), which
    # went on in the background meanwhile.
    held = tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    script = [sys.executable, "-c", INTERRUPTED_IN_A_LOOP, str(held)]
    with subprocess.Popen(script, stdout=subprocess.PIPE, text=True, env=env) as program:
        try:
            until(held.exists, "episode in a worker")
            program.send_signal(signal.SIGINT)
            out, _ = program.communicate(timeout=60)
        finally:
            program.kill()
    assert out.splitlines() == ["interrupted", "left []"]


class HeldActor:
    """A sync ``act()`` that blocks its thread until released."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def act(self, observation: Any) -> EchoAction:
        self.release.wait(120)
        return EchoAction(message="late")


def test_a_blocking_sync_agent_times_out_on_time_in_process() -> None:
    release = threading.Event()
    try:
        tasks = [
            Task(id="blocker", env=EchoEnvironment, agent=HeldActor(release), timeout=0.5),
            *echo_tasks(3, echo_agent),
        ]
        results = Runners.sync_run_task(tasks, RunConfig(max_concurrency=4, progress=False))
    finally:
        release.set()
    assert [r.status.value for r in results] == ["timeout", "ok", "ok", "ok"]


@pytest.mark.parametrize("name", list(REMOTE))
@pytest.mark.parametrize("agent", [BlockingActor(), blocking_async_agent], ids=["act", "async"])
def test_an_agent_that_blocks_for_a_minute_times_out_and_stalls_no_other_task(
    request: pytest.FixtureRequest, name: str, agent: Any
) -> None:
    # The sync act() runs in a thread, so its worker goes on; the async agent
    # blocks its worker's loop, so the driver reports the timeout itself and
    # replaces the worker, whose other episodes go to a healthy one.
    tasks = [
        Task(id="blocker", env=EchoEnvironment, agent=agent, timeout=1),
        *echo_tasks(6, echo_agent),
    ]
    results = Runners.sync_run_task(tasks, engine_config(request, name, max_concurrency=2))
    assert [r.status.value for r in results] == ["timeout"] + ["ok"] * 6, [r.error for r in results]
    assert results[0].error is not None
    assert "did not finish within its 1 s timeout" in results[0].error.message


class BlocksItsLoopBesideOthers:
    """The task "blocker" blocks its worker's loop (``time.sleep``) for a minute;
    every other task waits until it does before it plays, so that those beside
    it on its worker are surely in flight when the driver stops that worker."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    async def __call__(self, session: EpisodeSession) -> Any:
        if session.task.id == "blocker":
            await session.reset()
            append_line(self.flag, "blocking")
            time.sleep(60)  # noqa: ASYNC251 - the point: an agent that blocks its loop
            return None
        await wait_for_file(self.flag)
        return await echo_agent(session)


@pytest.mark.parametrize("name", ["processes", "spark"])
def test_episodes_beside_a_loop_blocking_agent_go_on_with_no_retries(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    # The driver stops the blocker's worker and hands the episodes beside it
    # on; with retries=0 they failed instead ("lost its worker 1 times").
    agent = BlocksItsLoopBesideOthers(str(tmp_path / "blocking"))
    # Its timeout must not run out before it blocks (its reset on a loaded
    # machine): the others would wait for the flag in vain, none of them beside it.
    tasks = [Task(id="blocker", env=EchoEnvironment, agent=agent, timeout=5)]
    tasks += echo_tasks(5, agent)
    config = engine_config(request, name, max_concurrency=2, retries=0)
    results = Runners.sync_run_task(tasks, config)
    statuses = [r.status.value for r in results]
    assert statuses == ["timeout"] + ["ok"] * 5, [r.error for r in results]
    # One was beside it, surely (its worker has two slots): played twice, and shown.
    assert sorted(r.attempts for r in results[1:])[-1] == 2


class BesideABlockerThenLosesItsWorker:
    """Task "beside" is on the worker of task "blocker" when that one blocks the
    loop (so the driver stops that worker); played again, it kills its own
    worker once (``os._exit``); the third time it answers."""

    def __init__(self, journal: str) -> None:
        self.journal = journal

    async def __call__(self, session: EpisodeSession) -> Any:
        if session.task.id == "blocker":
            await session.reset()
            await wait_for_file(self.journal)  # "beside" is in flight on this worker
            time.sleep(60)  # noqa: ASYNC251 - the point: an agent that blocks its loop
            return None
        append_line(self.journal, f"start {os.getpid()}")
        played = len(journal_lines(self.journal))
        if played == 1:
            await asyncio.Event().wait()  # until the driver stops this worker
        if played == 2:
            os._exit(3)
        return played


def test_a_worker_stopped_for_another_task_costs_the_tasks_beside_it_none_of_their_retries(
    tmp_path: Path,
) -> None:
    # "beside" lost its first worker for the blocker's sake, which the docs say
    # costs it none of its retries; yet when it then lost a worker of its own,
    # the one retry it had left was gone: "lost its worker 2 times (retries=1)".
    agent = BesideABlockerThenLosesItsWorker(str(tmp_path / "journal"))
    tasks = [
        Task(id="blocker", env=EchoEnvironment, agent=agent, timeout=5),
        Task(id="beside", agent=agent),
    ]
    config = RunConfig(
        worker_num=1,
        reuse_process=False,
        max_concurrency=2,
        retries=1,
        retry_backoff=0.01,
        progress=False,
    )
    results = Runners.sync_run_task(tasks, config)
    assert [r.status.value for r in results] == ["timeout", "ok"], [r.error for r in results]
    assert (results[1].value, results[1].attempts) == (3, 3)
