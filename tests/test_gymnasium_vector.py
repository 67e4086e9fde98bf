"""RemoteVectorEnv against a real server: the same episodes as an in-process SyncVectorEnv."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.utils.env_match import check_environments_match
from gymnasium.utils.passive_env_checker import check_obs
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from servers import slots_free

from openenv import CapacityError, ConcurrencyConfig, EnvValidationError, ServerPool
from openenv.adapters.gymnasium import RemoteGymnasiumEnv, RemoteVectorEnv, create_gymnasium_app
from openenv.testing import run_server

NUM_ENVS = 8


@pytest.fixture(scope="module")
def cartpole_url() -> Iterator[str]:
    app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=64))
    with run_server(app) as url:
        yield url


def train(envs: gymnasium.vector.VectorEnv[Any, Any, Any], steps: int) -> dict[str, Any]:
    """A CartPole loop written for ``SyncVectorEnv``: a linear policy, improved by
    hill climbing on episode returns, with next-step autoreset masking as
    Gymnasium's documentation shows it."""
    rng = np.random.default_rng(0)
    weights = np.zeros(4)
    best = -np.inf
    observations, _ = envs.reset(seed=123)
    returns = np.zeros(envs.num_envs)
    finished: list[float] = []
    trace = []
    autoreset = np.zeros(envs.num_envs, dtype=bool)
    candidate = weights + rng.normal(0, 0.5, 4)
    for _ in range(steps):
        greedy = (observations @ candidate > 0).astype(np.int64)
        explore = rng.random(envs.num_envs) < 0.3
        actions = np.where(explore, rng.integers(0, 2, envs.num_envs), greedy)
        observations, rewards, terminations, truncations, _ = envs.step(actions)
        trace.append((observations.copy(), rewards.copy(), terminations.copy()))
        returns += np.where(autoreset, 0.0, rewards)
        done = np.logical_or(terminations, truncations) & ~autoreset
        for i in np.flatnonzero(done):
            finished.append(float(returns[i]))
            returns[i] = 0.0
            if finished[-1] > best:
                best, weights = finished[-1], candidate
            candidate = weights + rng.normal(0, 0.5, 4)
        autoreset = np.logical_or(terminations, truncations)
    return {"trace": trace, "finished": finished, "best": best}


def test_a_training_loop_for_sync_vector_env_runs_unchanged(cartpole_url: str) -> None:
    local = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * NUM_ENVS)
    remote = RemoteVectorEnv(cartpole_url, num_envs=NUM_ENVS)
    try:
        assert remote.single_observation_space == local.single_observation_space
        assert remote.single_action_space == local.single_action_space
        assert remote.action_space == local.action_space
        expected, got = train(local, 300), train(remote, 300)
    finally:
        local.close()
        remote.close()
    assert_same_training(expected, got)
    assert got["best"] > 20  # and the loop kept a policy that balances a while
    for obs_r, _, _ in got["trace"]:
        assert (
            remote.observation_space.contains(obs_r.astype(np.float32)) or np.isfinite(obs_r).all()
        )


def assert_same_training(expected: dict[str, Any], got: dict[str, Any]) -> None:
    """Two ``train`` runs saw the same episodes, step by step."""
    assert got["finished"] == expected["finished"]
    assert len(got["finished"]) > NUM_ENVS  # autoreset happened, many times
    for (obs_l, rew_l, term_l), (obs_r, rew_r, term_r) in zip(
        expected["trace"], got["trace"], strict=True
    ):
        np.testing.assert_allclose(obs_r, obs_l, rtol=1e-6)
        np.testing.assert_array_equal(rew_r, rew_l)
        np.testing.assert_array_equal(term_r, term_l)


def test_same_step_autoreset_gives_the_final_observation_in_infos(cartpole_url: str) -> None:
    mode = AutoresetMode.SAME_STEP
    local = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 4, autoreset_mode=mode)
    remote = RemoteVectorEnv(cartpole_url, num_envs=4, autoreset_mode=mode)
    try:
        obs_l, _ = local.reset(seed=7)
        obs_r, _ = remote.reset(seed=7)
        np.testing.assert_allclose(obs_r, obs_l, rtol=1e-6)
        finals = 0
        for step in range(120):
            actions = np.full(4, step % 2)
            obs_l, _rew_l, term_l, _trunc_l, info_l = local.step(actions)
            obs_r, _rew_r, term_r, _trunc_r, info_r = remote.step(actions)
            np.testing.assert_allclose(obs_r, obs_l, rtol=1e-6)
            np.testing.assert_array_equal(term_r, term_l)
            assert ("final_obs" in info_r) == ("final_obs" in info_l)
            if "final_obs" in info_l:
                finals += 1
                np.testing.assert_array_equal(info_r["_final_obs"], info_l["_final_obs"])
                for i in np.flatnonzero(info_l["_final_obs"]):
                    np.testing.assert_allclose(
                        info_r["final_obs"][i], info_l["final_obs"][i], rtol=1e-6
                    )
        assert finals > 0
    finally:
        local.close()
        remote.close()


async def test_bad_actions_are_refused_and_closing_frees_every_slot(cartpole_url: str) -> None:
    remote = RemoteVectorEnv(cartpole_url, num_envs=NUM_ENVS)
    try:
        remote.reset(seed=1)
        with pytest.raises(EnvValidationError):
            remote.step(np.full(NUM_ENVS, 5))  # not in Discrete(2)
        observations, *_ = remote.step(np.zeros(NUM_ENVS, dtype=np.int64))
        assert observations.shape == (NUM_ENVS, 4)
    finally:
        remote.close()
    await slots_free(cartpole_url)


def test_a_server_without_gymnasium_spaces_is_named(echo_url: str) -> None:
    from openenv import ConnectionFailedError

    with pytest.raises(ConnectionFailedError, match="create_gymnasium_app"):
        RemoteVectorEnv(echo_url, num_envs=2)


@pytest.mark.parametrize("pooled", ["URLs joined by commas", "ServerPool"])
def test_a_pool_is_refused_saying_the_environments_step_on_one_server(
    cartpole_url: str, pooled: str
) -> None:
    # multiplex.md: a vector env's environments cannot be spread over a
    # ServerPool. A pool was an AttributeError ('decode'), its URLs joined by
    # commas "not a valid environment URL".
    pool = (
        f"{cartpole_url},{cartpole_url}" if pooled != "ServerPool" else ServerPool([cartpole_url])
    )
    for make in (lambda: RemoteVectorEnv(pool, num_envs=2), lambda: RemoteGymnasiumEnv(pool)):  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="on one server, not a pool"):
            make()


def checker_warnings(env: gymnasium.Env[Any, Any]) -> set[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True, skip_close_check=True)
    return {str(w.message) for w in caught}


def test_one_remote_environment_passes_gymnasiums_env_checker(cartpole_url: str) -> None:
    env = RemoteGymnasiumEnv(cartpole_url)
    local = gymnasium.make("CartPole-v1").unwrapped
    try:
        # CartPole's own space draws warnings (infinite bounds): the remote env
        # may draw those, and nothing else.
        assert checker_warnings(env) <= checker_warnings(local)
        check_environments_match(env, gymnasium.make("CartPole-v1"), num_steps=300, seed=5)
    finally:
        env.close()
        local.close()


def test_the_vector_envs_batches_stay_in_their_spaces(cartpole_url: str) -> None:
    remote = RemoteVectorEnv(cartpole_url, num_envs=NUM_ENVS)
    try:
        observations, _ = remote.reset(seed=3)
        check_obs(observations, remote.observation_space, "reset")
        for _ in range(50):
            observations, rewards, terminations, truncations, _ = remote.step(
                remote.action_space.sample()
            )
            check_obs(observations, remote.observation_space, "step")
            assert rewards.shape == terminations.shape == truncations.shape == (NUM_ENVS,)
            assert rewards.dtype == np.float64
            assert terminations.dtype == truncations.dtype == np.bool_
    finally:
        remote.close()


async def test_more_envs_than_the_server_has_room_for_is_refused_and_leaves_nothing() -> None:
    app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=3))
    with run_server(app) as url:
        with pytest.raises(CapacityError):
            RemoteVectorEnv(url, num_envs=5)
        await slots_free(url)  # the three that did open were closed with the connection
        envs = RemoteVectorEnv(url, num_envs=3)
        envs.close()
