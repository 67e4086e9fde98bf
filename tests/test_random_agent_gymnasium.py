"""The runtime's RandomAgent plays any served Gymnasium environment with no agent code."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from gymnasium_env.server.app import app as cartpole_app
from openenv import ConcurrencyConfig, RandomAgent, RunConfig, Runners, Task
from openenv.adapters.gymnasium import create_gymnasium_app, gymnasium_models
from openenv.testing import run_server


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_random_agent_plays_a_served_gymnasium_environment(env_id: str) -> None:
    app = (
        cartpole_app
        if env_id == "CartPole-v1"
        else create_gymnasium_app(env_id, ConcurrencyConfig(max_concurrent_envs=16))
    )
    with run_server(app) as url:
        tasks = [
            Task(id=f"t{i}", env=url, seed=i, agent=RandomAgent(seed=7), max_steps=30)
            for i in range(8)
        ]
        results = Runners.sync_run_task(tasks, run_conf=RunConfig(progress=False))
        again = Runners.sync_run_task(tasks, run_conf=RunConfig(progress=False))
    assert [r.status for r in results] == ["ok"] * 8, [r.error for r in results]
    assert all(1 <= r.steps <= 30 for r in results)
    # Seeded environment and seeded agent: the same episodes again.
    assert [(r.steps, r.reward) for r in results] == [(r.steps, r.reward) for r in again]


class Acting(gymnasium.Env[np.ndarray, Any]):
    """An environment with a given action space (and nothing else to it)."""

    observation_space = spaces.Discrete(1)

    def __init__(self, action_space: spaces.Space[Any]) -> None:
        self.action_space = action_space

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-np.inf, np.inf, (2,), dtype=np.int64),  # int64's whole range
        spaces.Box(-np.inf, -1000.0, (2,)),  # only an upper bound, below -100
        spaces.Box(np.array([[0, 10], [20, 30]]), np.array([[1, 11], [21, 31]])),
        spaces.MultiDiscrete([[2, 30], [4, 5]], start=[[1, 1], [0, -3]]),
    ],
    ids=["int64-unbounded", "below-minus-100", "box-2d-per-element", "multidiscrete-2d"],
)
def test_random_agent_samples_actions_in_the_action_space(space: spaces.Space[Any]) -> None:
    models = gymnasium_models(Acting(space))
    agent = RandomAgent(models.action_cls, seed=0)
    for _ in range(50):
        # The server validates each action with this model (and checks it is in the space).
        action = models.action_cls.model_validate(agent.act(None))
        assert space.contains(np.asarray(action.action, dtype=space.dtype))
