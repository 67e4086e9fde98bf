"""The runtime's behaviour beyond the engines: configuration, retries, agents, failures.

These run on the in-process engine (and on local worker processes where the
behaviour is about processes), against real servers on loopback.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import functools
import importlib
import io
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, NoReturn

import pytest
from pydantic import AnyUrl, BaseModel, Field
from rich.console import Console
from runtime_agents import AsyncCounter, echo_agent, exiting_agent, messages
from servers import Ping, PingEnvironment, Pong, Tracker

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import (
    Action,
    ConcurrencyConfig,
    EngineError,
    Environment,
    Observation,
    SessionClosedError,
    State,
    WebSocketEnvClient,
    create_app,
)
from openenv.runtime import (
    EpisodeSession,
    LocalRuntime,
    ParallelizableAgent,
    RandomAgent,
    RunConfig,
    Runners,
    Task,
    TaskResult,
    TaskStatus,
    exec_tasks,
)
from openenv.runtime.progress import ProgressDisplay
from openenv.runtime.random_agent import sample_schema
from openenv.testing import run_server

QUICK = RunConfig(retry_backoff=0.01, progress=False)


def factory_task(task_id: str, agent: Any, **options: Any) -> Task:
    return Task(
        id=task_id, env=functools.partial(EchoEnvironment, max_steps=3), agent=agent, **options
    )


# -- configuration ------------------------------------------------------------


def test_unknown_engine_lists_the_valid_ones() -> None:
    with pytest.raises(
        ValueError, match=r"choose one of local, ray, spark \(did you mean 'spark'\?\)"
    ):
        RunConfig(engine_name="sparc")


@pytest.mark.parametrize(
    "options",
    [{"worker_num": 0}, {"max_concurrency": 0}, {"timeout": 0}, {"retries": -1}, {"workers": 2}],
)
def test_run_config_rejects_nonsense(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(options))):
        RunConfig(**options)


def test_engine_names_may_be_strings_in_any_case() -> None:
    assert RunConfig(engine_name="RAY") == RunConfig(engine_name="ray")


def test_cls_must_be_an_engine() -> None:
    with pytest.raises(ValueError, match="cls"):
        RunConfig(cls=dict)


@pytest.mark.parametrize(("engine", "extra"), [("ray", "ray"), ("spark", "pyspark")])
def test_a_missing_extra_names_the_install_command(
    engine: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the extra were not installed: importing it fails.
    monkeypatch.setitem(sys.modules, extra, None)
    monkeypatch.delitem(sys.modules, f"openenv.runtime.{engine}", raising=False)
    tasks = [factory_task("t0", echo_agent)]
    with pytest.raises(EngineError, match=rf"pip install 'openenv-scale\[{engine}\]'"):
        Runners.sync_run_task(tasks, RunConfig(engine_name=engine))


def test_the_runtime_imports_no_server_and_no_engine() -> None:
    code = (
        "import sys, openenv, openenv.runtime; "
        "heavy = {'fastapi', 'starlette', 'uvicorn', 'ray', 'pyspark', 'rich'}; "
        "loaded = heavy & set(sys.modules); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_runtime_exports_are_complete_and_sorted() -> None:
    import openenv.runtime

    public = {
        name
        for name, value in vars(openenv.runtime).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("openenv")
    }
    assert public <= set(openenv.runtime.__all__), public - set(openenv.runtime.__all__)
    assert openenv.runtime.__all__ == sorted(openenv.runtime.__all__)


# -- tasks --------------------------------------------------------------------


def test_task_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="isn't a valid environment URL"):
        Task(id="t", env="localhost:8000", agent=echo_agent)
    with pytest.raises(
        TypeError, match=r"pass EchoEnvironment .* instead of EchoEnvironment\(\.\.\.\)"
    ):
        Task(id="t", env=EchoEnvironment(), agent=echo_agent)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="agent must be"):
        Task(id="t", env=EchoEnvironment, agent="echo")
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        Task(id="t", env=EchoEnvironment, agent=echo_agent, max_steps=0)
    with pytest.raises(ValueError, match="non-empty string"):
        Task(id="", env=EchoEnvironment, agent=echo_agent)


def test_an_agent_class_instead_of_an_instance_is_refused_naming_the_fix() -> None:
    # Played as is, every episode failed: "act() missing 1 required positional argument".
    with pytest.raises(
        TypeError, match=r"agent is the class AsyncCounter; .* agent=AsyncCounter\(\)"
    ):
        Task(id="t", env=EchoEnvironment, agent=AsyncCounter)
    assert Task(id="t", env=EchoEnvironment, agent=AsyncCounter()).agent is not None


def test_task_ids_must_be_unique() -> None:
    tasks = [factory_task("same", echo_agent), factory_task("same", echo_agent)]
    with pytest.raises(ValueError, match="repeated: same"):
        Runners.sync_run_task(tasks)


def test_no_tasks_no_results() -> None:
    assert Runners.sync_run_task([]) == []


async def test_sync_run_task_inside_a_running_event_loop() -> None:
    results = Runners.sync_run_task([factory_task("t0", echo_agent)], QUICK)
    assert results[0].value == messages("t0")
    results = await Runners.run_task([factory_task("t1", echo_agent)], QUICK)
    assert results[0].value == messages("t1")
    assert (await exec_tasks([factory_task("t2", echo_agent)], QUICK))[0].ok


def test_a_task_keys_a_dict_and_joins_a_set_whatever_its_fields_hold() -> None:
    def task(**options: Any) -> Task:
        return Task(
            id="t0", env=EchoEnvironment, agent=echo_agent, reset_kwargs={"a": 2}, **options
        )

    first, same, other = task(), task(), task(input=["a", "list"])
    assert {first: "played"}[same] == "played"  # equal tasks hash alike
    assert len({first, same}) == 1
    assert first != other  # one id, yet not equal
    assert len({first, other}) == 2
    (result,) = Runners.sync_run_task([first], QUICK)  # and plays as before
    assert result.ok, result.msg


# -- failures and retries -----------------------------------------------------


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_connection_failures_are_retried_then_reported() -> None:
    url = f"http://127.0.0.1:{_unused_port()}"
    results = Runners.sync_run_task(
        [Task(id="t0", env=url, agent=echo_agent)], QUICK.model_copy(update={"retries": 3})
    )
    assert results[0].status is TaskStatus.ERROR
    assert results[0].error is not None
    assert results[0].error.type == "ConnectionFailedError"
    assert results[0].attempts == 4


def test_a_full_server_is_retried_then_reported() -> None:
    app = create_app(PingEnvironment, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=1))
    with run_server(app) as url:
        holder = WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong).sync()
        with holder:
            holder.reset()
            results = Runners.sync_run_task([Task(id="t0", env=url, agent=echo_agent)], QUICK)
    assert results[0].error is not None
    assert results[0].error.type == "CapacityError"
    assert results[0].attempts == 3


def test_only_connection_level_failures_are_retried() -> None:
    calls: list[str] = []

    async def flaky(session: EpisodeSession) -> str:
        calls.append(session.task.id)
        if calls.count(session.task.id) == 1:
            raise SessionClosedError("the connection dropped")
        return "second time lucky"

    async def broken(session: EpisodeSession) -> str:
        calls.append(session.task.id)
        raise KeyError("not a connection problem")

    results = Runners.sync_run_task(
        [factory_task("flaky", flaky), factory_task("broken", broken)], QUICK
    )
    assert (results[0].status, results[0].value, results[0].attempts) == (
        TaskStatus.OK,
        "second time lucky",
        2,
    )
    assert (results[1].status, results[1].attempts) == (TaskStatus.ERROR, 1)
    assert calls.count("broken") == 1


def test_a_retried_tasks_reward_and_steps_are_its_last_attempts() -> None:
    # A retry plays the episode again from its reset: what the lost attempt
    # scored is discarded with its steps, not added to the new one's.
    attempts: list[int] = []

    async def lost_then_played(session: EpisodeSession) -> str:
        attempts.append(len(attempts) + 1)
        await session.reset()
        await session.step({"message": "ab"})  # 0.2
        if len(attempts) == 1:
            await session.step({"message": "abcdef"})  # 0.6, then the connection is lost
            raise SessionClosedError("the connection dropped")
        return "played"

    (result,) = Runners.sync_run_task([factory_task("t0", lost_then_played)], QUICK)
    assert (result.value, result.attempts, result.steps) == ("played", 2, 1)
    assert result.reward == pytest.approx(0.2)


def test_a_kept_session_closed_since_is_replaced_without_a_retry(echo_server_url: str) -> None:
    async def closes_its_session(session: EpisodeSession) -> str:
        await session.reset()
        await session.client.close()  # the pool will hand this session to the next task
        return "closed"

    tasks = [
        Task(id="t0", env=echo_server_url, agent=closes_its_session),
        Task(id="t1", env=echo_server_url, agent=echo_agent),
    ]
    results = Runners.sync_run_task(tasks, QUICK.model_copy(update={"sequence_dependent": True}))
    assert [r.status for r in results] == [TaskStatus.OK, TaskStatus.OK]
    assert results[1].attempts == 1


def test_agent_that_is_not_async_is_a_clear_error() -> None:
    def not_async(session: EpisodeSession) -> str:
        return "oops"

    result = Runners.sync_run_task([factory_task("t0", not_async)], QUICK)[0]
    assert result.error is not None
    assert result.error.type == "TypeError"
    assert "async def agent(session)" in result.error.message


def test_agents_own_timeout_error_is_an_error_not_a_timeout() -> None:
    async def raises_timeout(session: EpisodeSession) -> None:
        raise TimeoutError("the agent's own")

    result = Runners.sync_run_task([factory_task("t0", raises_timeout, timeout=30)], QUICK)[0]
    assert result.status is TaskStatus.ERROR
    assert result.error is not None
    assert result.error.message == "the agent's own"


def test_run_config_timeout_applies_to_every_task() -> None:
    async def hangs(session: EpisodeSession) -> None:
        await asyncio.Event().wait()

    tasks = [factory_task("t0", hangs), factory_task("t1", echo_agent)]
    results = Runners.sync_run_task(tasks, QUICK.model_copy(update={"timeout": 2.0}))
    assert [r.status for r in results] == [TaskStatus.TIMEOUT, TaskStatus.OK]


# -- in-process environments --------------------------------------------------


def test_in_process_errors_are_the_servers_errors() -> None:
    async def bad_action(session: EpisodeSession) -> None:
        await session.reset()
        await session.step({"mesage": "typo"})

    def broken_factory() -> EchoEnvironment:
        raise RuntimeError("no GPU")

    class Undeclared(Environment):  # type: ignore[type-arg]
        def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
            return Observation()

    tasks = [
        factory_task("validation", bad_action),
        Task(id="factory", env=broken_factory, agent=echo_agent),
        Task(id="undeclared", env=Undeclared, agent=echo_agent),
    ]
    results = Runners.sync_run_task(tasks, QUICK)
    errors = [(r.error.type, r.error.message) for r in results if r.error is not None]
    assert errors[0][0] == "EnvValidationError"
    assert "mesage" in errors[0][1]
    assert errors[1] == (
        "FactoryError",
        "[FACTORY_ERROR] could not create the environment: RuntimeError: no GPU",
    )
    assert errors[2][0] == "TypeError"
    assert "Environment[MyAction, MyObservation, MyState]" in errors[2][1]


def test_in_process_environments_and_threads_are_released() -> None:
    tracker = Tracker()

    async def one_step(session: EpisodeSession) -> int:
        await session.reset()
        return (await session.step(Ping(message="hi"))).observation.count

    async def fails(session: EpisodeSession) -> None:
        await session.reset()
        await session.step(Ping(fail=True))

    make = functools.partial(PingEnvironment, tracker)
    tasks = [Task(id=f"t{i}", env=make, agent=fails if i == 3 else one_step) for i in range(10)]
    results = Runners.sync_run_task(tasks, QUICK.model_copy(update={"max_concurrency": 4}))
    assert [r.value for r in results] == [1, 1, 1, None, 1, 1, 1, 1, 1, 1]
    assert results[3].error is not None
    assert results[3].error.type == "EnvExecutionError"
    # Sessions are reused between episodes, so fewer environments than tasks; all closed.
    assert 1 <= len(tracker.created) <= 5
    assert sorted(tracker.closed) == sorted(tracker.created)
    deadline = time.monotonic() + 10
    while any(t.name.startswith("openenv-inprocess") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "in-process worker threads outlived the run"
        time.sleep(0.01)


def test_act_agents_may_be_async_and_stop_at_max_steps() -> None:
    task = Task(id="t0", env=EchoEnvironment, agent=AsyncCounter(), max_steps=4)
    result = Runners.sync_run_task([task], QUICK)[0]
    assert (result.steps, result.value["echoed_message"], result.value["done"]) == (
        4,
        "xxxx",
        False,
    )
    assert result.reward == pytest.approx(0.1 + 0.2 + 0.3 + 0.4)


# -- local worker processes ---------------------------------------------------

PROCESSES = QUICK.model_copy(update={"worker_num": 2, "max_concurrency": 1})


def test_closures_and_lambdas_travel_to_worker_processes() -> None:
    suffix = "!"  # captured by the closure, which cloudpickle sends by value

    async def shout(session: EpisodeSession) -> str:
        await session.reset()
        result = await session.step({"message": session.task.id + suffix})
        return str(result.observation.echoed_message)

    make_env = lambda: EchoEnvironment(max_steps=2)  # noqa: E731 - a lambda on purpose
    tasks = [Task(id=f"t{i}", env=make_env, agent=shout) for i in range(4)]
    results = Runners.sync_run_task(tasks, PROCESSES)
    assert [r.value for r in results] == ["t0!", "t1!", "t2!", "t3!"]


def test_a_task_that_kills_every_worker_fails_alone_after_its_retries() -> None:
    # t0 kills the process playing it, each time: it is handed out 1 + retries
    # times, then reported; the other tasks go to the surviving and new workers.
    agents = [exiting_agent, echo_agent, echo_agent, echo_agent]
    tasks = [factory_task(f"t{i}", agent) for i, agent in enumerate(agents)]
    results = Runners.sync_run_task(tasks, PROCESSES)
    assert [r.status.value for r in results] == ["error", "ok", "ok", "ok"]
    assert results[0].error is not None
    assert results[0].error.type == "WorkerError"
    assert "exited with code 3" in results[0].error.message
    assert "lost its worker 3 times (retries=2)" in results[0].error.message
    assert results[0].attempts == 3
    assert [r.attempts for r in results[1:]] == [1, 1, 1]


def test_an_agent_that_cannot_be_pickled_fails_before_the_run(tmp_path: Path) -> None:
    lock = threading.Lock()
    played = tmp_path / "played"

    async def holds_a_lock(session: EpisodeSession) -> bool:
        return lock.locked()

    async def marks(session: EpisodeSession) -> None:
        played.touch()

    tasks = [factory_task("t0", marks), factory_task("t1", holds_a_lock)]
    with pytest.raises(TypeError, match=r"task 't1' cannot be pickled .*holds_a_lock.*lock"):
        Runners.sync_run_task(tasks, PROCESSES)
    assert not played.exists()  # nothing ran
    # In process, nothing needs pickling: the same tasks run.
    assert all(r.ok for r in Runners.sync_run_task(tasks, QUICK))


def test_a_task_whose_input_cannot_be_pickled_is_named_with_its_input() -> None:
    # The error blamed "its agent echo_agent, or its env": neither holds the socket.
    with socket.socket() as connection:
        tasks = [
            factory_task("t0", echo_agent),
            Task(id="t1", env=EchoEnvironment, agent=echo_agent, input={"conn": connection}),
        ]
        with pytest.raises(TypeError) as raised:
            Runners.sync_run_task(tasks, PROCESSES)
    message = str(raised.value)
    assert message.startswith("task 't1' cannot be pickled to send it to a worker (its input ")
    assert "cannot pickle 'socket' object" in message
    assert "echo_agent" not in message


def test_a_result_that_cannot_be_pickled_fails_alone() -> None:
    async def returns_a_lock(session: EpisodeSession) -> threading.Lock:
        return threading.Lock()

    tasks = [factory_task("t0", echo_agent), factory_task("t1", returns_a_lock)]
    results = Runners.sync_run_task(tasks, PROCESSES)
    assert [r.status.value for r in results] == ["ok", "error"]
    assert results[1].error is not None
    assert "returned a lock that cannot be pickled" in results[1].error.message


def test_a_result_the_driver_cannot_unpickle_fails_alone(tmp_path: Path) -> None:
    # A module only the worker puts on its path: the driver cannot rebuild its objects.
    (tmp_path / "worker_only_mod.py").write_text("class Thing:\n    pass\n")
    folder = str(tmp_path)

    async def returns_a_worker_only_type(session: EpisodeSession) -> Any:
        sys.path.insert(0, folder)
        return importlib.import_module("worker_only_mod").Thing()

    tasks = [factory_task("t0", returns_a_worker_only_type), factory_task("t1", echo_agent)]
    results = Runners.sync_run_task(tasks, PROCESSES)
    assert [r.status.value for r in results] == ["error", "ok"]
    assert results[0].error is not None
    assert results[0].error.type == "ResultUnpicklingError"
    assert "worker_only_mod" in results[0].error.message


def _raise(exc: BaseException) -> NoReturn:
    raise exc


class Raises:
    """A value whose unpickling raises ``exc``: a ``__reduce__`` runs code where it is loaded."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> tuple[Any, ...]:
        return (_raise, (self.exc,))


@pytest.mark.timeout(60)  # the old failure was a run that never ended
@pytest.mark.parametrize("exc", [SystemExit("unpickled"), KeyboardInterrupt("unpickled")])
def test_a_result_whose_unpickling_raises_a_base_exception_fails_alone(
    exc: BaseException,
) -> None:
    # It escaped into the driver's background loop and killed it: this run,
    # and every later one in the program, waited for ever.
    async def returns_it(session: EpisodeSession) -> Raises:
        return Raises(exc)

    tasks = [factory_task("t0", returns_it), factory_task("t1", echo_agent)]
    results = Runners.sync_run_task(tasks, PROCESSES)
    assert [r.status.value for r in results] == ["error", "ok"]
    assert results[0].error is not None
    assert results[0].error.type == "ResultUnpicklingError"
    assert f"{type(exc).__name__}: unpickled" in results[0].error.message
    later = Runners.sync_run_task([factory_task("t2", echo_agent)], PROCESSES)
    assert [r.status.value for r in later] == ["ok"]


def test_a_broken_custom_engine_is_caught() -> None:
    class Forgetful(LocalRuntime):
        async def run(self, tasks: Any, on_result: Any) -> list[TaskResult]:
            return (await super().run(tasks, on_result))[1:]

    class Shuffling(LocalRuntime):
        async def run(self, tasks: Any, on_result: Any) -> list[TaskResult]:
            return (await super().run(tasks, on_result))[::-1]

    tasks = [factory_task("t0", echo_agent), factory_task("t1", echo_agent)]
    with pytest.raises(EngineError, match="returned 1 results for 2 tasks"):
        Runners.sync_run_task(tasks, QUICK.model_copy(update={"cls": Forgetful}))
    with pytest.raises(EngineError, match="returned 't1' where the result of task 't0' belongs"):
        Runners.sync_run_task(tasks, QUICK.model_copy(update={"cls": Shuffling}))


def test_spark_without_a_master_says_how_to_get_one() -> None:
    # In a fresh process: no Spark context is active, and no master is configured.
    code = (
        "from openenv.runtime import RunConfig; from openenv.runtime.spark import context; "
        "context(RunConfig(engine_name='spark'))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1
    assert "EngineError: no Spark master is configured" in run.stderr
    assert "in_local=True" in run.stderr


# -- RandomAgent --------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: float = Field(ge=-1, le=1)
    y: float = Field(gt=0, lt=1)


class Everything(Action):
    name: str = Field(min_length=2, max_length=5)
    count: int = Field(ge=3, le=9, multiple_of=3)
    flag: bool
    color: Color
    mode: Literal["a", "b"]
    point: Point
    points: list[Point] = Field(min_length=1, max_length=3)
    maybe: int | None = None
    pair: tuple[int, str]
    tags: dict[str, int] = Field(default_factory=dict)


def test_random_actions_are_valid() -> None:
    schema = Everything.model_json_schema()
    rng = random.Random(0)
    for _ in range(300):
        Everything.model_validate(sample_schema(schema, rng))


class Tree(BaseModel):
    label: str = ""
    children: list[Tree]
    parent: Tree | None = None


class Plant(Action):
    tree: Tree


def test_random_actions_of_a_model_within_itself_are_finite_and_valid() -> None:
    # Up to three children a node, each a tree: drawn freely, about half the
    # trees grew until a RecursionError.
    schema = Plant.model_json_schema()
    rng = random.Random(0)
    for _ in range(300):
        Plant.model_validate(sample_schema(schema, rng))


class Meeting(Action):
    when: datetime.datetime
    at: datetime.time  # once a random word, refused every time
    lasts: datetime.timedelta  # likewise
    link: AnyUrl  # likewise
    room: uuid.UUID


def test_random_actions_of_string_formats_are_valid() -> None:
    schema = Meeting.model_json_schema()
    rng = random.Random(0)
    for _ in range(100):
        Meeting.model_validate(sample_schema(schema, rng))


def test_random_agent_samples_simple_patterns_and_refuses_the_rest() -> None:
    class Coded(Action):
        code: str = Field(pattern=r"^[A-Z]{3}-\d{2}$")

    class Grouped(Action):
        code: str = Field(pattern=r"^(ab|cd)+$")

    for seed in range(20):
        Coded.model_validate(RandomAgent(Coded, seed=seed).act(None))  # valid every time
    with pytest.raises(TypeError, match="strings matching"):
        RandomAgent(Grouped).act(None)


def test_random_agent_smoke_tests_a_server_from_its_schema(echo_server_url: str) -> None:
    tasks = [
        Task(id=f"t{i}", env=echo_server_url, agent=RandomAgent(seed=1), seed=i) for i in range(5)
    ]
    results = Runners.sync_run_task(tasks, QUICK)
    assert all(r.ok and r.steps == 50 and r.value["done"] for r in results), results
    again = Runners.sync_run_task(tasks, QUICK)
    assert [r.value for r in again] == [r.value for r in results]
    assert len({r.value["echoed_message"] for r in results}) > 1  # episodes differ by task


# -- ParallelizableAgent ------------------------------------------------------


async def test_parallel_sub_agents_run_at_the_same_time() -> None:
    # Each waits for the other to have started: only concurrent execution finishes.
    started = {"a": asyncio.Event(), "b": asyncio.Event()}

    def waiter(me: str, other: str) -> Any:
        async def act(observation: Any) -> str:
            started[me].set()
            await asyncio.wait_for(started[other].wait(), 10)
            return me

        return act

    agent = ParallelizableAgent({"a": waiter("a", "b"), "b": waiter("b", "a")})
    assert await agent.act(None) == {"a": "a", "b": "b"}


async def test_parallel_sync_sub_agents_run_in_threads() -> None:
    barrier = threading.Barrier(2, timeout=10)

    class Blocking:
        def act(self, observation: Any) -> int:
            return barrier.wait()

    agent = ParallelizableAgent(
        [Blocking(), Blocking()], aggregate_func=lambda out: sorted(out.values())
    )
    assert await agent.act(None) == [0, 1]


def test_parallel_agent_plays_an_episode() -> None:
    class Word:
        def __init__(self, word: str) -> None:
            self.name = word

        def act(self, observation: Any) -> str:
            return self.name

    async def join(outputs: dict[str, Any]) -> EchoAction:
        # The words, then the random agent's proposed message.
        words = [o if isinstance(o, str) else o["message"] for o in outputs.values()]
        return EchoAction(message="+".join(words))

    agent = ParallelizableAgent(
        [Word("hi"), Word("ho"), RandomAgent(EchoAction)], aggregate_func=join
    )
    assert list(agent.agents) == ["hi", "ho", "RandomAgent"]
    result = Runners.sync_run_task([factory_task("t0", agent)], QUICK)[0]
    assert result.ok, result.error
    assert result.steps == 3
    assert result.value["echoed_message"].startswith("hi+ho+")


def test_parallel_agent_needs_agents() -> None:
    with pytest.raises(ValueError, match="at least one agent"):
        ParallelizableAgent([])
    with pytest.raises(TypeError, match="neither an act"):
        ParallelizableAgent({"x": 3})


# -- progress -----------------------------------------------------------------


def test_progress_counts_done_and_failed() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with ProgressDisplay(total=3, enabled=True, console=console) as progress:
        progress.update(TaskResult(task_id="a", status=TaskStatus.OK))
        progress.update(TaskResult(task_id="b", status=TaskStatus.TIMEOUT))
        progress.update(TaskResult(task_id="c", status=TaskStatus.OK))
    assert (progress.done, progress.failed) == (3, 1)
    assert "3/3" in out.getvalue()
    assert "1 failed" in out.getvalue()


# -- fixtures -----------------------------------------------------------------


@pytest.fixture(scope="module")
def echo_server_url() -> Iterator[str]:
    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=64)
    )
    with run_server(app) as url:
        yield url


# Silence "imported but unused" for names used only in annotations above.
_ = (State,)
