"""The runtime's RandomAgent plays any served Gymnasium environment with no agent code."""

from __future__ import annotations

import pytest

from gymnasium_env.server.app import app as cartpole_app
from openenv import ConcurrencyConfig, RandomAgent, RunConfig, Runners, Task
from openenv.adapters.gymnasium import create_gymnasium_app
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
