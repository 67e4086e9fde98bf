"""RemoteVectorEnv and RemoteGymnasiumEnv at the edges a user meets: spaces that
stretch their dtype, clients dropped without ``close()``, seeds that do not fit."""

from __future__ import annotations

import functools
import gc
import weakref
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_match import check_environments_match
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from servers import slots_free
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from openenv import ConcurrencyConfig, ConnectionFailedError, EnvExecutionError
from openenv.adapters.gymnasium import (
    RemoteGymnasiumEnv,
    RemoteVectorEnv,
    create_gymnasium_app,
    create_gymnasium_vector_app,
)
from openenv.testing import run_server

MAKERS = [create_gymnasium_app, create_gymnasium_vector_app]


class Counters(gymnasium.Env[np.ndarray, np.int64]):
    """Observes integers from anywhere in its space's dtype (as a Box made with
    infinite bounds does)."""

    def __init__(self, dtype: type[np.integer[Any]] = np.int64) -> None:
        bounds = np.iinfo(dtype)
        self.observation_space = spaces.Box(bounds.min, bounds.max, (2,), dtype=dtype)
        self.action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return self.observation_space.sample(), 1.0, False, False, {}


@pytest.mark.parametrize("make_app", MAKERS)
@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_integer_boxes_spanning_their_dtype_keep_their_bounds(
    make_app: Callable[..., Any], dtype: type[np.integer[Any]]
) -> None:
    factory = functools.partial(Counters, dtype)
    here = SyncVectorEnv([factory] * 2)
    with run_server(make_app(factory, ConcurrencyConfig(max_concurrent_envs=4))) as url:
        remote = RemoteVectorEnv(url, 2)
        try:
            # Through float64, the top bound (2**63 - 1, 2**64 - 1) came back as the bottom one.
            assert remote.single_observation_space == here.single_observation_space
            assert remote.observation_space == here.observation_space
            want, _ = here.reset(seed=3)
            got, _ = remote.reset(seed=3)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
            assert remote.observation_space.contains(got)
            got = remote.step(np.array([0, 1]))[0]
            np.testing.assert_array_equal(got, here.step(np.array([0, 1]))[0])
        finally:
            remote.close()
            here.close()


@pytest.mark.parametrize("make_app", MAKERS)
async def test_a_remote_env_dropped_without_close_frees_its_slots(
    make_app: Callable[..., Any],
) -> None:
    # Two slots: each client below needs them all, so a leaked one fails the next.
    with run_server(make_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=2))) as url:
        for _ in range(3):
            envs = RemoteVectorEnv(url, 2 if make_app is create_gymnasium_app else 1)
            envs.reset(seed=0)
            envs.step(envs.action_space.sample())
            dropped = weakref.ref(envs)
            del envs
            gc.collect()
            assert dropped() is None  # its connection's keepalive does not keep it alive
            await slots_free(url)
        env = RemoteGymnasiumEnv(url)
        env.reset(seed=0)
        single = weakref.ref(env)
        del env
        gc.collect()
        assert single() is None
        await slots_free(url)


class Labelled(gymnasium.Env[np.ndarray, np.int64]):
    """Infos of texts and of lists mixing numbers and texts."""

    observation_space = spaces.Box(-1.0, 1.0, (1,))
    action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {"label": "start", "pair": [1, "a"]}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return np.zeros(1, np.float32), 0.0, False, False, {"label": "b" * (1 + int(action))}


@pytest.mark.parametrize("make_app", MAKERS)
def test_infos_of_texts_and_mixed_lists_arrive_as_sync_vector_env_gives_them(
    make_app: Callable[..., Any],
) -> None:
    here = SyncVectorEnv([Labelled] * 2)
    with run_server(make_app(Labelled, ConcurrencyConfig(max_concurrent_envs=4))) as url:
        remote = RemoteVectorEnv(url, 2)
        try:
            got, want = remote.reset(seed=0)[1], here.reset(seed=0)[1]
            # A vector session's infos made [1, "a"] the strings ["1", "a"].
            assert [list(pair) for pair in got["pair"]] == [[1, "a"], [1, "a"]]
            assert got["label"].dtype == want["label"].dtype == object
            assert got["label"].tolist() == want["label"].tolist()
            actions = np.array([0, 1])
            got, want = remote.step(actions)[4], here.step(actions)[4]
            assert got["label"].dtype == object
            assert got["label"].tolist() == want["label"].tolist() == ["b", "bb"]
        finally:
            remote.close()
            here.close()


@pytest.mark.parametrize("make_app", MAKERS)
def test_a_wrong_number_of_seeds_is_a_value_error_as_in_sync_vector_env(
    make_app: Callable[..., Any],
) -> None:
    here = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 2)
    with run_server(make_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=2))) as url:
        remote = RemoteVectorEnv(url, 2)
        try:
            # A vector session's server refused it: an EnvExecutionError.
            with pytest.raises(ValueError, match="num_envs=2"):
                remote.reset(seed=[1, 2, 3])
            # As SyncVectorEnv: a ValueError since Gymnasium 1.2, an assertion before.
            with pytest.raises((ValueError, AssertionError), match="num_envs=2"):
                here.reset(seed=[1, 2, 3])
            np.testing.assert_array_equal(remote.reset(seed=[4, 5])[0], here.reset(seed=[4, 5])[0])
        finally:
            remote.close()
            here.close()


class Scalars(gymnasium.Env[dict[str, Any], np.int64]):
    """Observes 0-d arrays, on their own and nested."""

    def __init__(self) -> None:  # a space (and its generator) of its own
        self.observation_space = spaces.Dict(
            {"x": spaces.Box(-1.0, 1.0, ()), "t": spaces.Tuple((spaces.Box(0.0, 9.0, ()),))}
        )
        self.action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample(), {}

    def step(self, action: np.int64) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        return self.observation_space.sample(), 0.0, False, False, {}


def test_one_remote_environment_gives_0_d_observations_as_arrays() -> None:
    with run_server(create_gymnasium_app(Scalars)) as url:
        remote = RemoteGymnasiumEnv(url)
        try:
            observation, _ = remote.reset(seed=1)
            # Gymnasium's iterate made them numpy scalars.
            assert isinstance(observation["x"], np.ndarray)
            assert observation["x"].shape == ()
            assert isinstance(observation["t"][0], np.ndarray)
            check_environments_match(Scalars(), remote, num_steps=5, seed=2, skip_render=True)
        finally:
            remote.close()


@pytest.mark.parametrize("make_app", MAKERS)
def test_without_autoreset_a_step_before_resetting_ended_envs_steps_none(
    make_app: Callable[..., Any],
) -> None:
    settings = {"make_kwargs": {"max_episode_steps": 2}}
    app = make_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=2), **settings)
    with run_server(app) as url:
        envs = RemoteVectorEnv(url, 2, autoreset_mode=AutoresetMode.DISABLED)
        try:
            envs.reset(seed=0)
            envs.step(np.array([0, 1]))
            assert envs.step(np.array([0, 1]))[3].all()  # both truncated at the time limit
            envs.reset(options={"reset_mask": np.array([True, False])})
            with pytest.raises(EnvExecutionError, match=r"environments \[1\]") as refused:
                envs.step(np.array([0, 1]))  # environment 1 was not reset
            assert refused.value.details["envs"] == [1]
            envs.reset(options={"reset_mask": np.array([False, True])})
            # Environment 0 stepped once since its reset, not twice: its episode goes on.
            truncations = envs.step(np.array([0, 1]))[3]
            np.testing.assert_array_equal(truncations, [False, False])
        finally:
            envs.close()


@pytest.mark.parametrize(
    "page",
    [
        HTMLResponse("<html>my dashboard</html>"),
        JSONResponse({"status": "ok"}),
        JSONResponse({"action_space": "Discrete(2)", "observation_space": None}),
    ],
    ids=["a web page", "another service's JSON", "not descriptions"],
)
def test_a_url_of_another_service_answering_every_path_is_a_connection_error_saying_so(
    page: Response,
) -> None:
    # The wrong port, say: a web app there answers /gymnasium/spaces too, with 200.
    async def anything(request: Request) -> Response:
        return page

    app = Starlette(routes=[Route("/{path:path}", anything)])
    refused = pytest.raises(ConnectionFailedError, match="is this an openenv server")
    with run_server(app) as url, refused as caught:
        RemoteGymnasiumEnv(url)
    assert url.removeprefix("http://") in str(caught.value)
