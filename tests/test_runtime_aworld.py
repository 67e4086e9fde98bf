"""AWorld's spellings of the runtime API, written exactly as its users write them."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from typing import Any

import pytest
from runtime_agents import answer_agent, echo_agent, messages
from servers import PingEnvironment, Tracker, ping_app

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv.runtime import (
    EngineName,
    EpisodeSession,
    ParallelizableAgent,
    RunConfig,
    Runners,
    Task,
    TaskResult,
    TaskStatus,
    exec_tasks,
    sync_exec_tasks,
)
from openenv.testing import run_server

CONF = RunConfig(max_concurrency=4, progress=False)
ENV = functools.partial(EchoEnvironment, max_steps=3)


async def solve(session: EpisodeSession) -> str:
    """An agent that needs no environment: it answers its input."""
    question = session.input
    left, _, right = question.removeprefix("what is ").removesuffix("?").partition("+")
    return str(int(left) + int(right))


def test_sync_run_task_takes_task_and_run_conf_keywords() -> None:
    tasks = [Task(id=f"t{i}", env=ENV, agent=echo_agent) for i in range(3)]
    results = Runners.sync_run_task(task=tasks, run_conf=CONF)
    assert [(r.task_id, r.value) for r in results] == [(t.id, messages(t.id)) for t in tasks]
    one = Runners.sync_run_task(task=tasks[0], run_conf=CONF)  # a single Task too
    assert [r.task_id for r in one] == ["t0"]


async def test_run_task_takes_the_same_keywords_when_awaited() -> None:
    results = await Runners.run_task(task=Task(id="t0", env=ENV, agent=echo_agent), run_conf=CONF)
    assert [r.value for r in results] == [messages("t0")]


def test_a_task_with_an_input_and_no_environment() -> None:
    task = Task(input="what is 2+2?", agent=solve, id="q1")
    (result,) = Runners.sync_run_task(task=task, run_conf=CONF)
    assert (result.task_id, result.status.value, result.value) == ("q1", "ok", "4")
    assert Task(input="what is 1+1?", agent=solve).id.startswith("task-")  # ids by default


def test_a_session_without_an_environment_says_so() -> None:
    async def wants_env(session: EpisodeSession) -> None:
        await session.reset()

    (result,) = Runners.sync_run_task(task=Task(input="x", agent=wants_env), run_conf=CONF)
    assert result.error is not None
    assert "this task has no environment" in result.error.message


def test_exec_tasks_from_plain_code_returns_the_results() -> None:
    tasks = [Task(id="q1", input="what is 3+4?", agent=solve)]
    assert [r.value for r in exec_tasks(tasks=tasks, run_conf=CONF)] == ["7"]
    assert [r.value for r in sync_exec_tasks(tasks=tasks, run_conf=CONF)] == ["7"]


async def test_exec_tasks_is_awaitable_in_async_code() -> None:
    results: list[TaskResult] = await exec_tasks(
        tasks=[Task(id="q1", input="what is 5+5?", agent=solve)], run_conf=CONF
    )
    assert [r.value for r in results] == ["10"]


class Say:
    def __init__(self, word: str, name: str) -> None:
        self.word = word
        self.name = name

    def act(self, observation: EchoObservation) -> str:
        return self.word


def test_parallelizable_agent_as_aworld_writes_it() -> None:
    seen: list[Any] = []

    def aggregate_func(agent: ParallelizableAgent, results: dict[str, Any]) -> EchoAction:
        seen.append(agent)
        return EchoAction(message="+".join(results[name] for name in sorted(results)))

    parallel = ParallelizableAgent(
        name="parallel_search",
        agents=[Say("hi", "search_a"), Say("ho", "search_b")],
        aggregate_func=aggregate_func,
    )
    (result,) = Runners.sync_run_task(task=Task(id="t0", env=ENV, agent=parallel), run_conf=CONF)
    assert result.ok, result.error
    assert result.value["echoed_message"] == "hi+ho"
    assert result.steps == 3  # max_steps=3 ends the episode
    assert [agent.name for agent in seen] == ["parallel_search"] * 3  # once a step


def test_a_wrong_aggregate_signature_fails_at_construction() -> None:
    def three(agent: Any, results: Any, extra: Any) -> None: ...

    with pytest.raises(TypeError, match=r"cannot be called as f\(agent, results\)"):
        ParallelizableAgent(name="x", agents=[Say("a", "a")], aggregate_func=three)


def test_session_agents_as_sub_agents_each_play_their_own_episode() -> None:
    async def shout(session: EpisodeSession) -> str:
        await session.reset()
        result = await session.step({"message": "HEY"})
        return str(result.observation.echoed_message)

    async def whisper(session: EpisodeSession) -> str:
        await session.reset()
        await session.step({"message": "psst"})
        result = await session.step({"message": "hush"})
        return str(result.observation.echoed_message)

    async def best(agent: ParallelizableAgent, results: dict[str, str]) -> str:
        await asyncio.sleep(0)  # an async aggregate, e.g. a judge call
        return max(results.values(), key=len)

    parallel = ParallelizableAgent(
        name="best_of_two", agents={"shout": shout, "whisper": whisper}, aggregate_func=best
    )
    (result,) = Runners.sync_run_task(task=Task(id="t0", env=ENV, agent=parallel), run_conf=CONF)
    assert (result.status.value, result.value) == ("ok", "hush")
    assert result.steps == 3  # the two sub-episodes' steps add up


def test_results_are_keyed_by_task_id_as_aworlds_dict_of_responses() -> None:
    # As AWorld's examples read them: result[task.id].answer, res.get(task.id),
    # `task.id in result`, .success / .msg / .time_cost / .id.
    tasks = [
        Task(id="q1", input="what is 2+2?", agent=solve),
        Task(id="q2", input="bad", agent=solve),
    ]
    result = Runners.sync_run_task(task=tasks, run_conf=CONF)
    assert result["q1"].answer == "4"
    assert result.get("q1").success
    assert ("q1" in result, "q3" in result, result.get("q3")) == (True, False, None)
    failed = result["q2"]
    assert (failed.id, failed.success, failed.answer) == ("q2", False, None)
    assert str(failed.msg).startswith("ValueError: invalid literal for int()")
    assert result["q1"].time_cost == result["q1"].duration >= 0
    assert list(result.keys()) == ["q1", "q2"]
    assert [r.answer for r in result.values()] == ["4", None]
    assert [(k, r.task_id) for k, r in result.items()] == [("q1", "q1"), ("q2", "q2")]
    with pytest.raises(KeyError):
        result["q3"]
    # Still the list it was: input order, indexable, iterating gives results.
    assert [r.task_id for r in result] == ["q1", "q2"]
    assert result[0].answer == "4"
    # AWorld's parallel-task README loops over the results and reads .answer.
    assert [f"{r.task_id}: {r.answer}" for r in result] == ["q1: 4", "q2: None"]


async def test_awaited_run_task_and_exec_tasks_are_keyed_by_id_too() -> None:
    task = Task(id="q1", input="what is 1+2?", agent=solve)
    assert (await Runners.run_task(task=task, run_conf=CONF))[task.id].answer == "3"
    assert (await exec_tasks(tasks=[task], run_conf=CONF)).get(task.id).answer == "3"
    assert sync_exec_tasks(tasks=[task], run_conf=CONF)[task.id].answer == "3"
    assert (await exec_tasks(tasks=[], run_conf=CONF)).get("q1") is None


def test_lookup_by_id_follows_the_list_when_it_changes() -> None:
    tasks = [Task(id=f"q{i}", input=f"what is {i}+0?", agent=solve) for i in range(3)]
    results = Runners.sync_run_task(task=tasks, run_conf=CONF)
    assert results["q0"].answer == "0"
    results.sort(key=lambda r: r.task_id, reverse=True)
    assert (results["q0"].answer, results[0].task_id) == ("0", "q2")
    results[0] = results.pop()  # q0 now first, q2 gone
    assert "q2" not in results
    assert results["q0"] is results[0]
    results.append(TaskResult(task_id="extra", status=TaskStatus.OK, value="x"))
    assert results["extra"].answer == "x"


async def where(session: EpisodeSession) -> int:
    return os.getpid()


def test_reuse_process_false_plays_in_a_worker_process_as_aworld_docs_write_it() -> None:
    # AWorld's parallel-task README: the local multiprocess engine.
    tasks = [Task(id=f"t{i}", input=i, agent=where) for i in range(2)]
    conf = RunConfig(engine_name=EngineName.LOCAL, reuse_process=False, progress=False)
    results = Runners.sync_run_task(task=tasks, run_conf=conf)
    assert [r.status.value for r in results] == ["ok", "ok"]
    assert os.getpid() not in {r.answer for r in results}


def test_reuse_process_true_plays_in_this_process_whatever_worker_num() -> None:
    lock = threading.Lock()  # a closure over a lock cannot travel to a worker process

    async def holds_a_lock(session: EpisodeSession) -> int:
        with lock:
            return os.getpid()

    tasks = [Task(id=f"t{i}", agent=holds_a_lock) for i in range(3)]
    conf = RunConfig(worker_num=3, reuse_process=True, progress=False)
    results = Runners.sync_run_task(task=tasks, run_conf=conf)
    assert [r.answer for r in results] == [os.getpid()] * 3


def test_sync_run_plays_one_input_with_an_agent_as_aworlds_quick_start() -> None:
    response = Runners.sync_run(input="what is 2+3?", agent=solve)
    assert (response.success, response.answer) == (True, "5")
    # env= gives the agent an environment; run_conf= works as in AWorld.
    played = Runners.sync_run(input="x", agent=echo_agent, env=ENV, run_conf=CONF)
    assert played.answer == messages(played.id)


async def test_run_is_awaitable_with_aworlds_keywords() -> None:
    response = await Runners.run(input="what is 4+4?", agent=solve, run_conf=CONF)
    assert response.answer == "8"


def test_what_run_cannot_honour_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="`agent` and `swarm` only choose one"):
        Runners.sync_run(input="hi", agent=solve, swarm=object())
    with pytest.raises(ValueError, match="`input` is empty"):
        Runners.sync_run(input="", agent=solve)
    with pytest.raises(TypeError, match="AWorld's Swarm has no counterpart here"):
        Runners.sync_run(input="hi", swarm=object())
    with pytest.raises(ValueError, match="tool_names names AWorld's tools"):
        Runners.sync_run(input="hi", agent=solve, tool_names=["search_api"])
    with pytest.raises(ValueError, match="session_id keys AWorld's memory"):
        Runners.sync_run(input="hi", agent=solve, session_id="s1")
    # Not a list of names: said so by name, not a bare "'int' object is not iterable".
    with pytest.raises(TypeError, match="tool_names must be a list of tool names, not int"):
        Runners.sync_run(input="hi", agent=solve, tool_names=1)  # type: ignore[arg-type]
    # One name as a string is still a name of AWorld's tools.
    with pytest.raises(ValueError, match="tool_names names AWorld's tools"):
        Runners.sync_run(input="hi", agent=solve, tool_names="search_api")


def test_tool_names_none_means_none_given() -> None:
    assert Runners.sync_run(input="what is 2+2?", agent=solve, tool_names=None).answer == "4"


async def add_one(session: EpisodeSession) -> int:
    if session.input == "fail":
        raise ValueError("asked to fail")
    return int(session.input) + 1


@pytest.mark.parametrize("worker_num", [1, 2])
def test_a_sequence_dependent_run_chains_inputs_as_aworlds_workflow(worker_num: int) -> None:
    # AWorld's "Task native workflow": only the first task has an input; each
    # next one gets the previous answer (or, after a failure, its message).
    tasks = [Task(id="t1", input="1", agent=add_one), Task(id="t2", agent=add_one)]
    tasks += [Task(id="t3", agent=add_one), Task(id="t4", input="fail", agent=add_one)]
    tasks += [Task(id="t5", agent=solve_or_say)]
    conf = RunConfig(sequence_dependent=True, worker_num=worker_num, progress=False)
    results = Runners.sync_run_task(task=tasks, run_conf=conf)
    assert [results[t].answer for t in ("t1", "t2", "t3")] == [2, 3, 4]
    assert results["t4"].msg == "ValueError: asked to fail"  # its own input wins
    assert results["t5"].answer == "got: ValueError: asked to fail"


async def solve_or_say(session: EpisodeSession) -> str:
    return f"got: {session.input}"


def test_what_a_result_does_not_keep_says_where_to_look() -> None:
    # AWorld's Core Capabilities page prints result.trajectory after sync_run.
    result = Runners.sync_run(input="what is 1+1?", agent=solve)
    with pytest.raises(AttributeError, match=r"RunConfig\(record=folder\)"):
        print(result.trajectory)
    with pytest.raises(AttributeError, match="counts no model token usage"):
        print(result.usage)
    assert not hasattr(result, "trajectory")


# AWorld's parallel-task README, its three engines spelled as it spells them.
AWORLD_ENGINES = {
    "ray": {"engine_name": EngineName.RAY, "worker_num": 3},
    "spark": {"engine_name": EngineName.SPARK, "in_local": True},
    "local": {"engine_name": EngineName.LOCAL, "reuse_process": False},
}


@pytest.mark.parametrize("name", list(AWORLD_ENGINES))
def test_aworlds_parallel_task_example_runs_unchanged(
    name: str, request: pytest.FixtureRequest
) -> None:
    if name != "local":
        request.getfixturevalue({"ray": "ray_cluster", "spark": "spark_context"}[name])
    tasks = [
        Task(input="What is machine learning?", agent=answer_agent, id="task1"),
        Task(input="Explain neural networks", agent=answer_agent, id="task2"),
        Task(input="What is deep learning?", agent=answer_agent, id="task3"),
    ]
    res = Runners.sync_run_task(task=tasks, run_conf=RunConfig(**AWORLD_ENGINES[name]))
    assert {task_id: result.answer for task_id, result in res.items()} == {
        t.id: f"answer to {t.input}" for t in tasks
    }
    assert res["task2"].success

    # examples/aworld_quick_start/parallel_task/run.py: awaited exec_tasks.
    async def main() -> list[str]:
        results = await exec_tasks(tasks=tasks, run_conf=RunConfig(**AWORLD_ENGINES[name]))
        return [f"Task {task_id}: {result.answer}" for task_id, result in results.items()]

    assert asyncio.run(main())[0] == "Task task1: answer to What is machine learning?"


async def reset_and_say(session: EpisodeSession) -> tuple[str, str | None]:
    """What the environment's reset saw: its message and the episode id."""
    reply = await session.reset()
    return reply.observation.message, (await session.state()).episode_id


@pytest.mark.parametrize("where", ["in process", "over a URL"])
def test_a_dict_input_naming_the_seed_and_episode_id_passes_them_to_reset(where: str) -> None:
    # runners.md: a dict input is also passed to reset. One naming `seed` or
    # `episode_id` (a dataset row) failed every episode: they went twice.
    row = {"seed": 7, "episode_id": "row-7", "difficulty": 2}

    def play(env: Any) -> dict[str, Any]:
        tasks = [
            Task(id="row", env=env, agent=reset_and_say, input=row),
            Task(id="own", env=env, agent=reset_and_say, input=row, seed=1, episode_id="own-1"),
            Task(id="kwargs", env=env, agent=reset_and_say, reset_kwargs={"seed": 5}),
        ]
        return {r.task_id: r.value for r in Runners.sync_run_task(tasks, CONF)}

    if where == "in process":
        answers = play(PingEnvironment)
    else:
        with run_server(ping_app(Tracker())) as url:
            answers = play(url)
    assert answers == {
        "row": ("reset:7:2", "row-7"),
        "own": ("reset:1:2", "own-1"),  # the task's own fields first
        "kwargs": ("reset:5", "seed-5"),
    }
