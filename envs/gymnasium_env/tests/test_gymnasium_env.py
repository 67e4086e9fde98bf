"""CartPole and Pendulum over a real server: typed round trips, seeds, 50 sessions."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import random
import re
from collections.abc import Iterator
from pathlib import Path

import gymnasium
import httpx
import numpy as np
import pytest

from gymnasium_env import (
    CartPoleAction,
    CartPoleEnv,
    CartPoleObservation,
    GymnasiumEnv,
    GymnasiumState,
    PendulumAction,
    PendulumEnv,
    PendulumObservation,
)
from gymnasium_env.server.app import app as cartpole_app
from openenv import ConcurrencyConfig, EnvExecutionError, EnvValidationError
from openenv.adapters.gymnasium import create_gymnasium_app
from openenv.testing import run_server


@pytest.fixture(scope="module")
def cartpole_url() -> Iterator[str]:
    with run_server(cartpole_app) as url:
        yield url


@pytest.fixture(scope="module")
def pendulum_url() -> Iterator[str]:
    app = create_gymnasium_app("Pendulum-v1", ConcurrencyConfig(max_concurrent_envs=8))
    with run_server(app) as url:
        yield url


def local_episode(env_id: str, seed: int, actions: list[object]) -> list[tuple[object, ...]]:
    """The same episode played by Gymnasium in this process, for comparison."""
    env = gymnasium.make(env_id)
    observation, _ = env.reset(seed=seed)
    trajectory: list[tuple[object, ...]] = [(observation.tolist(),)]
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        trajectory.append((observation.tolist(), float(reward), terminated, truncated))
        if terminated or truncated:
            break
    env.close()
    return trajectory


def test_a_cartpole_episode_round_trips_typed_values(cartpole_url: str) -> None:
    rng = random.Random(7)
    actions = [rng.randrange(2) for _ in range(500)]
    with CartPoleEnv(cartpole_url).sync() as env:
        first = env.reset(seed=7)
        assert isinstance(first.observation, CartPoleObservation)
        assert len(first.observation.observation) == 4
        assert all(type(x) is float for x in first.observation.observation)
        assert (first.reward, first.done, first.observation.terminated) == (None, False, False)
        trajectory: list[tuple[object, ...]] = [(first.observation.observation,)]
        played = []
        while True:
            action = actions[len(played)]
            result = env.step(CartPoleAction(action=action))
            played.append(action)
            obs = result.observation
            trajectory.append((obs.observation, result.reward, obs.terminated, obs.truncated))
            assert result.done == (obs.terminated or obs.truncated)
            if result.done:
                break
        state = env.state()
        assert isinstance(state, GymnasiumState)
        assert (state.env_id, state.step_count, state.total_reward) == (
            "CartPole-v1",
            len(played),
            float(len(played)),
        )
        with pytest.raises(EnvExecutionError, match="the episode is over"):
            env.step(CartPoleAction(action=0))
        # The session goes on: the next episode.
        assert env.reset(seed=8).done is False
    assert trajectory == local_episode("CartPole-v1", 7, played)


def test_the_same_seed_gives_the_same_trajectory(cartpole_url: str) -> None:
    actions = [0, 1, 1, 0, 1, 0, 0, 1, 1, 1]

    def play(seed: int) -> list[tuple[list[float], float | None]]:
        with CartPoleEnv(cartpole_url).sync() as env:
            steps = [(env.reset(seed=seed).observation.observation, None)]
            for action in actions:
                result = env.step(CartPoleAction(action=action))
                steps.append((result.observation.observation, result.reward))
        return steps

    assert play(3) == play(3)
    assert play(3)[0] != play(4)[0]


def test_bad_cartpole_actions_are_validation_errors(cartpole_url: str) -> None:
    with GymnasiumEnv(cartpole_url).sync() as env:
        with pytest.raises(EnvExecutionError, match=r"reset\(\) before the first step"):
            env.step({"action": 0})
        env.reset(seed=0)
        with pytest.raises(EnvValidationError, match="less than or equal to 1"):
            env.step({"action": 2})
        with pytest.raises(EnvValidationError):
            env.step({"action": "left"})
        with pytest.raises(EnvValidationError):
            env.step({})
        result = env.step({"action": 1})
        assert result.reward == 1.0
        assert len(result.observation.observation) == 4  # type: ignore[attr-defined]


def test_a_reset_that_raises_leaves_the_session_playable(cartpole_url: str) -> None:
    actions = [0, 1, 1, 0, 1]
    with CartPoleEnv(cartpole_url).sync() as env:
        with pytest.raises(EnvExecutionError, match="seed must be 0 or more"):
            env.reset(seed=-1)
        with pytest.raises(EnvExecutionError):
            env.reset(options={"low": 5})  # CartPole refuses bounds with low > high
        with pytest.raises(EnvExecutionError, match=r"reset\(\) before the first step"):
            env.step(CartPoleAction(action=0))
        trajectory: list[tuple[object, ...]] = [(env.reset(seed=5).observation.observation,)]
        for action in actions:
            result = env.step(CartPoleAction(action=action))
            obs = result.observation
            trajectory.append((obs.observation, result.reward, obs.terminated, obs.truncated))
    assert trajectory == local_episode("CartPole-v1", 5, actions)


def test_pendulum_box_actions_and_truncation(pendulum_url: str) -> None:
    torques = [float(x) for x in np.linspace(-2.0, 2.0, 200)]
    with PendulumEnv(pendulum_url).sync() as env:
        first = env.reset(seed=11)
        assert isinstance(first.observation, PendulumObservation)
        trajectory: list[tuple[object, ...]] = [(first.observation.observation,)]
        for torque in torques:
            result = env.step(PendulumAction(action=[torque]))
            obs = result.observation
            assert len(obs.observation) == 3
            assert all(type(x) is float for x in obs.observation)
            assert isinstance(result.reward, float)
            assert result.reward <= 0.0
            trajectory.append((obs.observation, result.reward, obs.terminated, obs.truncated))
        # Pendulum never terminates; its time limit (200 steps) truncates it.
        assert (result.done, obs.terminated, obs.truncated) == (True, False, True)
        env.reset(seed=11)
        with pytest.raises(EnvValidationError, match="less than or equal to 2"):
            env.step(PendulumAction.model_construct(action=[2.5]))
        with pytest.raises(EnvValidationError, match="at most 1 item"):
            env.step({"action": [1.0, 1.0]})
        assert env.step(PendulumAction(action=[0.0])).done is False
    actions = [np.array([t], dtype=np.float32) for t in torques]
    assert trajectory == local_episode("Pendulum-v1", 11, actions)  # type: ignore[arg-type]


def test_the_schema_describes_the_spaces(cartpole_url: str, pendulum_url: str) -> None:
    cartpole = httpx.get(f"{cartpole_url}/schema").json()
    action = cartpole["action"]["properties"]["action"]
    assert (action["type"], action["minimum"], action["maximum"]) == ("integer", 0, 1)
    observation = cartpole["observation"]["properties"]["observation"]
    # Per-element bounds; the infinite ones are left out.
    assert [item.get("maximum") for item in observation["prefixItems"]] == pytest.approx(
        [4.8, None, 0.41887903, None]
    )
    pendulum = httpx.get(f"{pendulum_url}/schema").json()["action"]["properties"]["action"]
    assert pendulum["items"] == {"type": "number", "minimum": -2.0, "maximum": 2.0}
    assert (pendulum["minItems"], pendulum["maxItems"]) == (1, 1)
    metadata = httpx.get(f"{cartpole_url}/metadata").json()
    assert (metadata["name"], metadata["supports_concurrent_sessions"]) == ("CartPole-v1", True)


def test_50_concurrent_cartpole_sessions_match_local_play(cartpole_url: str) -> None:
    async def episode(seed: int) -> tuple[list[int], float, int]:
        rng = random.Random(seed)
        actions = []
        async with CartPoleEnv(cartpole_url) as env:
            result = await env.reset(seed=seed)
            while not result.done:
                actions.append(rng.randrange(2))
                result = await env.step(CartPoleAction(action=actions[-1]))
            state = await env.state()
        return actions, state.total_reward, state.step_count

    async def main() -> list[tuple[list[int], float, int]]:
        return await asyncio.gather(*(episode(seed) for seed in range(50)))

    results = asyncio.run(main())
    for seed, (actions, total, steps) in enumerate(results):
        local = local_episode("CartPole-v1", seed, actions)
        assert (total, steps) == (float(len(local) - 1), len(local) - 1), seed
    assert httpx.get(f"{cartpole_url}/health").json()["active_sessions"] == 0


def test_the_readme_example_runs_as_written(cartpole_url: str) -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", readme.split("## Drive", 1)[1], re.DOTALL)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace("http://localhost:8000", cartpole_url), "README.md", "exec"), {})
    returns = []
    for seed in range(20):  # the same policy, played by Gymnasium in this process
        env = gymnasium.make("CartPole-v1")
        observation, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            observation, reward, terminated, truncated, _ = env.step(int(observation[2] > 0))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    assert out.getvalue() == f"mean return over 20 episodes: {sum(returns) / 20}\n"


def test_the_readme_vector_example_runs_as_written(cartpole_url: str) -> None:
    run_the_readme_vector_example(cartpole_url)


def test_the_readme_vector_example_runs_unchanged_on_vector_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As the README serves it: GYMNASIUM_VECTOR=1 uvicorn server.app:app
    monkeypatch.setenv("GYMNASIUM_VECTOR", "1")
    module = importlib.reload(importlib.import_module("gymnasium_env.server.app"))
    try:
        assert module.app.title == "CartPole-v1 (vector)"
        with run_server(module.app) as url:
            run_the_readme_vector_example(url)
    finally:
        monkeypatch.delenv("GYMNASIUM_VECTOR")
        importlib.reload(module)


def run_the_readme_vector_example(url: str) -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Train with Gymnasium's vector API", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace("http://localhost:8000", url), "README.md", "exec"), {})
    # The same loop over Gymnasium's own vector env, in this process.
    from gymnasium.vector import SyncVectorEnv

    envs = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 64)
    observations, _ = envs.reset(seed=0)
    finished = 0
    for _ in range(200):
        actions = (observations[:, 2] > 0).astype(np.int64)
        observations, _, terminations, truncations, _ = envs.step(actions)
        finished += int(np.sum(terminations | truncations))
    envs.close()
    assert out.getvalue() == f"{finished} episodes ended in 200 steps of 64 environments\n"
    assert finished > 0
    assert httpx.get(f"{url}/health").json()["active_sessions"] == 0
