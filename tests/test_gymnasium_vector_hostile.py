"""RemoteVectorEnv (a session per environment) under hostile conditions: bad actions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from servers import slots_free

from openenv import (
    ConcurrencyConfig,
    EnvValidationError,
)
from openenv.adapters.gymnasium import RemoteVectorEnv, create_gymnasium_app
from openenv.testing import run_server

APPS = Path(__file__).parent / "apps"


@pytest.fixture(scope="module")
def cartpole_url() -> Iterator[str]:
    app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=8))
    with run_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def pendulum_url() -> Iterator[str]:
    app = create_gymnasium_app("Pendulum-v1", ConcurrencyConfig(max_concurrent_envs=8))
    with run_server(app) as url:
        yield url


def assert_in_step(here: SyncVectorEnv, remote: RemoteVectorEnv, steps: int) -> None:
    """``steps`` more steps of the same random actions give the same results in both."""
    here.action_space.seed(4)
    for _ in range(steps):
        actions = here.action_space.sample()
        expected, got = here.step(actions), remote.step(actions)
        for want, have in zip(expected[:4], got[:4], strict=True):
            np.testing.assert_allclose(have, want, rtol=1e-6)


@pytest.mark.parametrize(
    ("env_id", "bad", "culprit"),
    [
        ("CartPole-v1", [0, 1, 5, 0], 2),  # 5 is not in Discrete(2)
        ("CartPole-v1", [0, 1, 1, 0.5], 3),  # nor is 0.5 (not taken as 0)
        ("CartPole-v1", [1.7, 1, 1, 1], 0),  # nor 1.7 (not taken as 1)
        ("Pendulum-v1", [[0.0], [2.5], [0.0], [0.0]], 1),  # above the Box's high
    ],
)
async def test_a_bad_action_is_refused_before_any_environment_steps(
    request: pytest.FixtureRequest, env_id: str, bad: list[Any], culprit: int
) -> None:
    url = request.getfixturevalue("cartpole_url" if env_id == "CartPole-v1" else "pendulum_url")
    here = SyncVectorEnv([lambda: gymnasium.make(env_id)] * 4)
    remote = RemoteVectorEnv(url, num_envs=4)
    try:
        np.testing.assert_allclose(remote.reset(seed=9)[0], here.reset(seed=9)[0], rtol=1e-6)
        with pytest.raises(EnvValidationError) as refused:
            remote.step(np.array(bad))
        assert refused.value.errors[0]["loc"][0] == culprit  # it names the environment
        # No environment stepped: the next steps (over episode ends) are the
        # in-process ones, as if the bad call had never been made.
        assert_in_step(here, remote, 40 if env_id == "CartPole-v1" else 5)
    finally:
        here.close()
        remote.close()
    await slots_free(url)


@pytest.mark.parametrize("count", [3, 5])
async def test_a_wrong_number_of_actions_is_refused_before_any_environment_steps(
    cartpole_url: str, count: int
) -> None:
    here = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 4)
    remote = RemoteVectorEnv(cartpole_url, num_envs=4)
    try:
        np.testing.assert_allclose(remote.reset(seed=2)[0], here.reset(seed=2)[0], rtol=1e-6)
        with pytest.raises(ValueError, match=f"^{count} actions for num_envs=4$"):
            remote.step(np.ones(count, dtype=np.int64))
        assert_in_step(here, remote, 40)
    finally:
        here.close()
        remote.close()
    await slots_free(cartpole_url)
