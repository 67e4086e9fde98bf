"""The counter environment against a real server on a free loopback port."""

import asyncio

import httpx
import pytest

from counter_env import CounterAction, CounterEnv, CounterObservation, CounterState, CounterTask
from counter_env.server.app import app
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, EnvExecutionError, EnvSession, RemoteEnv, create_app
from openenv.testing import run_server


async def solve(session: EnvSession) -> float:
    """A tool-calling agent: read the target from the prompt's task, count, submit."""
    target = session.task.target  # type: ignore[union-attr]
    for _ in range(target):
        await session.call_tool("increment", amount=1)
    value = (await session.call_tool("get_value")).data
    assert value == target
    return (await session.call_tool("submit")).reward or 0.0


async def run_all(env: RemoteEnv, tasks: list[CounterTask]) -> list[float]:
    async def one(task: CounterTask) -> float:
        async with env.session(task) as session:
            return await solve(session)

    return await asyncio.gather(*(one(task) for task in tasks))


def test_splits_and_tasks() -> None:
    with run_server(app) as url:
        env = RemoteEnv(url).sync()
        assert env.list_splits() == ["train", "test"]
        assert len(env.list_tasks("test")) == 100
        tasks = env.list_tasks("train", offset=998)
    assert [t.id for t in tasks] == ["train-998", "train-999"]
    assert all(1 <= t.target <= 10 for t in tasks)  # type: ignore[attr-defined]


def test_200_concurrent_sessions_all_reach_reward_one() -> None:
    async def main(url: str) -> list[float]:
        env = RemoteEnv(
            url, observation_cls=CounterObservation, state_cls=CounterState, task_cls=CounterTask
        )
        tasks = await env.list_tasks("train", limit=200)
        assert all(isinstance(task, CounterTask) for task in tasks)
        return await run_all(env, tasks)  # type: ignore[arg-type]

    with run_server(app) as url:
        rewards = asyncio.run(main(url))
        assert httpx.get(f"{url}/health").json()["active_sessions"] == 0
    assert rewards == [1.0] * 200


def test_more_sessions_than_slots_wait_for_a_free_one() -> None:
    small = create_app(
        CounterEnvironment,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=4),
    )

    async def main(url: str) -> list[float]:
        env = RemoteEnv(url, max_connecting=8, task_cls=CounterTask)
        tasks = await env.list_tasks("test", limit=40)
        return await run_all(env, tasks)  # type: ignore[arg-type]

    with run_server(small) as url:
        assert asyncio.run(main(url)) == [1.0] * 40


def test_a_wrong_submit_scores_zero_and_ends_the_episode() -> None:
    with run_server(app) as url, CounterEnv(url).sync() as env:
        env.reset(task=CounterTask(id="t", target=3))
        env.call_tool("increment", amount=2)
        result = env.call_tool("submit")
        assert (result.reward, result.finished) == (0.0, True)
        assert result.text == "wrong: the counter is 2, the target was 3"
        state = env.state()
        assert (state.value, state.target, state.done) == (2, 3, True)
        # the plain step interface works too
        env.reset(seed=1)
        assert env.step(CounterAction(amount=4)).observation.value == 4


def test_a_step_after_submit_is_refused_and_changes_nothing() -> None:
    with run_server(app) as url, CounterEnv(url).sync() as env:
        env.reset(task=CounterTask(id="t", target=3))
        env.call_tool("increment", amount=3)
        assert env.call_tool("submit").reward == 1.0
        with pytest.raises(EnvExecutionError, match=r"the episode is over .*reset\(\)"):
            env.step(CounterAction(amount=1))
        state = env.state()
        assert (state.value, state.step_count, state.done) == (3, 2, True)
        env.reset(seed=1)
        assert env.step(CounterAction(amount=4)).observation.value == 4


def test_a_count_past_64_bits_is_refused_and_the_session_goes_on() -> None:
    # Once the counter went past 2**64: the step's reply could not be encoded,
    # so the session ended with "internal server error" (1011), and a tool's
    # failed while the counter had moved.
    big = 2**63 - 1
    with run_server(app) as url, CounterEnv(url).sync() as env:
        env.reset(task=CounterTask(id="t", target=3))
        assert env.step(CounterAction(amount=big)).observation.value == big
        with pytest.raises(EnvExecutionError, match=r"outside the 64-bit integers .* stays"):
            env.step(CounterAction(amount=1))
        with pytest.raises(EnvExecutionError, match=r"outside the 64-bit integers"):
            env.call_tool("increment", amount=big)
        state = env.state()
        assert (state.value, state.step_count) == (big, 1)
        assert env.call_tool("increment", amount=-big + 3).data == {"value": 3}
        assert env.call_tool("submit").reward == 1.0
