"""The same suite on every engine: in process, local processes, a Ray cluster, Spark local[2].

Everything runs for real: an echo server on loopback, worker processes, a
local Ray cluster and a local Spark context, each started once per session.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import httpx
import pytest
from runtime_agents import (
    STEPS,
    Shouter,
    chain_agent,
    echo_agent,
    env_var_agent,
    failing_agent,
    hanging_agent,
    messages,
    ping_agent,
)
from servers import Ping, PingEnvironment, Pong

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, ServerPool, create_app
from openenv.runtime import (
    RandomAgent,
    RunConfig,
    Runners,
    RuntimeEngine,
    Task,
    TaskResult,
    TaskStatus,
)
from openenv.runtime.base import ENGINES
from openenv.testing import run_server

ENGINES_UNDER_TEST = {
    "local": {"engine_name": "local", "worker_num": 1},
    "processes": {"engine_name": "local", "worker_num": 2},
    "ray": {"engine_name": "ray", "worker_num": 2},
    "spark": {"engine_name": "spark", "worker_num": 2},
}


@pytest.fixture(scope="module")
def echo_server() -> Iterator[str]:
    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=256)
    )
    with run_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def small_echo_servers() -> Iterator[list[str]]:
    """Two servers with room for 3 and 5 sessions: less than a run keeps in flight."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                run_server(
                    create_app(
                        EchoEnvironment,
                        EchoAction,
                        EchoObservation,
                        ConcurrencyConfig(max_concurrent_envs=cap),
                    )
                )
            )
            for cap in (3, 5)
        ]


@pytest.fixture(params=list(ENGINES_UNDER_TEST))
def engine(request: pytest.FixtureRequest) -> dict[str, Any]:
    name = request.param
    if name == "ray":
        request.getfixturevalue("ray_cluster")
    elif name == "spark":
        request.getfixturevalue("spark_context")
    return {**ENGINES_UNDER_TEST[name], "max_concurrency": 16, "retry_backoff": 0.01}


def run(tasks: list[Task], engine: dict[str, Any], **options: Any) -> list[TaskResult]:
    return Runners.sync_run_task(tasks, RunConfig(**{**engine, **options}))


def wait_for_no_sessions(url: str) -> None:
    """Every session the run opened is closed on the server (polled, with a deadline)."""
    deadline = time.monotonic() + 10
    while (active := httpx.get(f"{url}/health").json()["active_sessions"]) != 0:
        assert time.monotonic() < deadline, f"{active} sessions still open after the run"
        time.sleep(0.02)


def test_many_episodes_in_input_order(engine: dict[str, Any], echo_server: str) -> None:
    tasks = [Task(id=f"t{i:03}", env=echo_server, agent=echo_agent, seed=i) for i in range(200)]
    results = run(tasks, engine)
    assert [r.task_id for r in results] == [t.id for t in tasks]
    for result in results:
        assert result.status is TaskStatus.OK, result.error
        assert result.value == messages(result.task_id)
        assert result.steps == STEPS
        assert result.reward == pytest.approx(sum(len(m) for m in result.value) / 10)
        assert result.attempts == 1
        assert result.error is None
        assert result.started_at <= result.ended_at
    wait_for_no_sessions(echo_server)


def test_a_pool_of_small_servers_paces_the_run(
    engine: dict[str, Any], small_echo_servers: list[str]
) -> None:
    # 16 episodes in flight per worker, 8 slots in all: the pool makes them wait
    # for room (every worker process keeps its own count) instead of failing.
    pool = ServerPool(small_echo_servers)
    tasks = [Task(id=f"t{i:03}", env=pool, agent=echo_agent, seed=i) for i in range(60)]
    results = run(tasks, engine)
    for result in results:
        assert result.status is TaskStatus.OK, result.error
        assert result.value == messages(result.task_id)
        assert result.attempts == 1  # no refusal reached the runner's retries
    for url in small_echo_servers:
        wait_for_no_sessions(url)


def test_an_agent_that_raises_is_one_error(engine: dict[str, Any], echo_server: str) -> None:
    tasks = [
        Task(id=f"t{i}", env=echo_server, agent=failing_agent if i == 7 else echo_agent)
        for i in range(20)
    ]
    results = run(tasks, engine)
    failed = results[7]
    assert failed.status is TaskStatus.ERROR
    assert failed.error is not None
    assert (failed.error.type, failed.error.message) == ("ValueError", "agent of t7 gave up")
    assert "failing_agent" in failed.error.traceback
    assert (failed.steps, failed.attempts, failed.value) == (1, 1, None)
    assert [r.task_id for r in results] == [t.id for t in tasks]
    assert all(r.ok and r.value == messages(r.task_id) for i, r in enumerate(results) if i != 7)
    wait_for_no_sessions(echo_server)


def test_a_task_over_its_timeout_times_out(engine: dict[str, Any], echo_server: str) -> None:
    tasks = [Task(id=f"t{i}", env=echo_server, agent=echo_agent) for i in range(6)]
    tasks[2] = Task(id="t2", env=echo_server, agent=hanging_agent, timeout=0.5)
    results = run(tasks, engine)
    hung = results[2]
    assert hung.status is TaskStatus.TIMEOUT
    assert hung.error is not None
    assert hung.error.type == "TimeoutError"
    assert "within its 0.5 s timeout" in hung.error.message
    assert all(r.ok for i, r in enumerate(results) if i != 2)
    wait_for_no_sessions(echo_server)


def test_sequence_dependent_passes_results_along(engine: dict[str, Any], echo_server: str) -> None:
    agents = [chain_agent, chain_agent, failing_agent, chain_agent, chain_agent]
    tasks = [Task(id=f"c{i}", env=echo_server, agent=a) for i, a in enumerate(agents)]
    results = run(tasks, engine, sequence_dependent=True)
    assert [r.status.value for r in results] == ["ok", "ok", "error", "ok", "ok"]
    assert results[0].value == ["c0"]
    assert results[1].value == ["c0", "c1"]
    assert results[3].value == ["c2:error", "c3"]
    assert results[4].value == ["c2:error", "c3", "c4"]
    assert all(a.ended_at <= b.started_at for a, b in itertools.pairwise(results))


def test_a_custom_engine_class_is_used(engine: dict[str, Any], echo_server: str) -> None:
    base = RunConfig(**engine).engine_name.value
    module, _, name = ENGINES[base].partition(":")
    parent: type[RuntimeEngine] = getattr(__import__(module, fromlist=[name]), name)
    calls: list[int] = []

    class Counting(parent):  # type: ignore[valid-type, misc]
        async def run(self, tasks: Any, on_result: Any) -> list[TaskResult]:
            calls.append(len(tasks))
            return await super().run(tasks, on_result)

    tasks = [Task(id=f"t{i}", env=echo_server, agent=echo_agent) for i in range(4)]
    results = run(tasks, engine, cls=Counting)
    assert calls == [4]
    assert [r.value for r in results] == [messages(t.id) for t in tasks]


def test_results_round_trip_through_pickling(engine: dict[str, Any], echo_server: str) -> None:
    tasks = [
        Task(id="ok", env=echo_server, agent=echo_agent),
        Task(id="error", env=echo_server, agent=failing_agent),
        Task(id="timeout", env=echo_server, agent=hanging_agent, timeout=0.3),
    ]
    results = run(tasks, engine)
    assert [r.status.value for r in results] == ["ok", "error", "timeout"]
    assert pickle.loads(pickle.dumps(results)) == results
    assert cloudpickle.loads(cloudpickle.dumps(results)) == results


def test_in_process_factory_tasks_need_no_server(engine: dict[str, Any]) -> None:
    factory = functools.partial(EchoEnvironment, max_steps=4)
    tasks = [Task(id=f"f{i}", env=factory, agent=Shouter(), seed=i) for i in range(6)]
    tasks += [Task(id=f"r{i}", env=factory, agent=RandomAgent(seed=5), seed=i) for i in range(4)]
    results = run(tasks, engine)
    assert all(r.ok for r in results), [r.error for r in results]
    shouted = results[0]
    # Shouter echoes "A", "AA" ... (capitals plus one letter): rewards 0.1 + 0.2 + 0.3 + 0.4.
    assert (shouted.steps, shouted.reward) == (4, pytest.approx(1.0))
    assert shouted.value["echoed_message"] == "AAAa"
    assert shouted.value["done"] is True
    # Random actions are seeded by task: every engine draws the same ones.
    reference = Runners.sync_run_task(tasks[6:], RunConfig())
    assert [(r.value, r.reward) for r in results[6:]] == [(r.value, r.reward) for r in reference]


def test_results_stream_back_as_tasks_finish(engine: dict[str, Any]) -> None:
    # "slow" blocks in the server until "fast"'s result has reached the driver. If
    # results came back only at the end of the run, "slow" would time out instead
    # (at 25 s, before the server gives up waiting at 30 s).
    gate = threading.Event()

    def make_env() -> PingEnvironment:
        return PingEnvironment(gate=gate)

    base = RunConfig(**engine).engine_name.value
    module, _, name = ENGINES[base].partition(":")
    parent: type[RuntimeEngine] = getattr(__import__(module, fromlist=[name]), name)

    class OpensTheGate(parent):  # type: ignore[valid-type, misc]
        async def run(self, tasks: Any, on_result: Any) -> list[TaskResult]:
            def arrived(index: int, result: TaskResult) -> None:
                if result.task_id == "fast":
                    gate.set()
                on_result(index, result)

            return await super().run(tasks, arrived)

    app = create_app(make_env, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        tasks = [
            Task(id="slow", env=url, agent=ping_agent, timeout=25),
            Task(id="fast", env=url, agent=ping_agent),
        ]
        results = run(tasks, engine, cls=OpensTheGate)
    assert [(r.status.value, r.value) for r in results] == [("ok", "slow"), ("ok", "fast")]


def test_ray_options_reach_the_ray_tasks(ray_cluster: None) -> None:
    options = {"num_cpus": 0.5, "runtime_env": {"env_vars": {"OPENENV_TEST_MARK": "marked"}}}
    tasks = [Task(id=f"t{i}", env=EchoEnvironment, agent=env_var_agent) for i in range(2)]
    results = run(tasks, ENGINES_UNDER_TEST["ray"], engine_options=options)
    assert [r.value for r in results] == ["marked", "marked"]
