"""RemoteVectorEnv against environments that misbehave, each beside the same
environments in a ``SyncVectorEnv``: the spec for what the batch does."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from servers import slots_free
from test_gymnasium_vector_hostile import Gated

from openenv import ConcurrencyConfig, DeadlineError, EnvExecutionError, SessionClosedError
from openenv.adapters.gymnasium import (
    RemoteVectorEnv,
    create_gymnasium_app,
    create_gymnasium_vector_app,
)
from openenv.testing import run_server

MAKERS = [create_gymnasium_app, create_gymnasium_vector_app]


class Fragile(gymnasium.Env[np.ndarray, np.int64]):
    """Counts its steps; action 1 raises, and an episode lasts two steps."""

    observation_space = spaces.Box(0.0, 10.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if action == 1:
            raise RuntimeError("the simulator crashed")
        self.steps += 1
        return np.full(1, self.steps, np.float32), 1.0, self.steps >= 2, False, {}


def play(envs: gymnasium.vector.VectorEnv[Any, Any, Any], rounds: list[list[int]]) -> list[Any]:
    """Each round's observations and terminations, or the type of the error it raised."""
    envs.reset(seed=0)
    out: list[Any] = []
    for actions in rounds:
        try:
            observations, _, terminations, _, _ = envs.step(np.array(actions))
        except (RuntimeError, EnvExecutionError) as exc:
            out.append(type(exc).__name__)
        else:
            out.append((observations.ravel().tolist(), terminations.tolist()))
    return out


@pytest.mark.parametrize("make_app", MAKERS)
def test_after_one_environments_step_raises_the_others_go_on(
    make_app: Callable[..., Any],
) -> None:
    # Environment 0's episode ends in the step where environment 1's raises. Its
    # result is lost with the error, yet it must be reset by the next step (as
    # SyncVectorEnv resets it) and not be refused a step for ever.
    rounds = [[0, 0], [0, 1], [0, 0], [0, 0], [0, 0]]
    mode = AutoresetMode.SAME_STEP
    here = SyncVectorEnv([Fragile] * 2, autoreset_mode=mode)
    with run_server(make_app(Fragile, ConcurrencyConfig(max_concurrent_envs=4))) as url:
        remote = RemoteVectorEnv(url, num_envs=2, autoreset_mode=mode)
        try:
            want = play(here, rounds)
            got = play(remote, rounds)
        finally:
            remote.close()
            here.close()
    assert want[1] == "RuntimeError"
    assert got[1] == "EnvExecutionError"
    ended_then_reset = [([1.0, 0.0], [False, True]), ([0.0, 1.0], [True, False])]
    assert got[2:] == want[2:] == [*ended_then_reset, ([1.0, 0.0], [False, True])]


@pytest.mark.parametrize("make_app", MAKERS)
def test_after_one_environments_step_raises_the_next_step_autoresets_those_that_ended(
    make_app: Callable[..., Any],
) -> None:
    rounds = [[0, 0], [0, 1], [0, 0], [0, 0], [0, 0]]
    with run_server(make_app(Fragile, ConcurrencyConfig(max_concurrent_envs=4))) as url:
        remote = RemoteVectorEnv(url, num_envs=2)
        try:
            got = play(remote, rounds)
        finally:
            remote.close()
    assert got[1] == "EnvExecutionError"
    # Every later step goes through, and environment 1 plays its episode on.
    assert all(isinstance(result, tuple) for result in got[2:]), got
    assert [observations[1] for observations, _ in got[2:]] == [2.0, 0.0, 1.0]


class NonFinite(gymnasium.Env[np.ndarray, np.int64]):
    """An info with arrays holding NaN and infinities, as a physics engine's may."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {"distances": np.array([np.inf, 1.5])}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        grid = np.array([[np.nan, 1.0], [-np.inf, float(action)]])
        return np.zeros(1, np.float32), 0.0, False, False, {"grid": grid}


@pytest.mark.parametrize("make_app", MAKERS)
def test_info_arrays_holding_nan_or_infinities_are_float_arrays_as_in_sync_vector_env(
    make_app: Callable[..., Any],
) -> None:
    here = SyncVectorEnv([NonFinite] * 2)
    with run_server(make_app(NonFinite, ConcurrencyConfig(max_concurrent_envs=4))) as url:
        remote = RemoteVectorEnv(url, num_envs=2)
        try:
            got, want = remote.reset(seed=0)[1], here.reset(seed=0)[1]
            np.testing.assert_array_equal(got["distances"], want["distances"])
            assert got["distances"].dtype == np.float64
            actions = np.array([0, 1])
            got, want = remote.step(actions)[4], here.step(actions)[4]
            np.testing.assert_array_equal(got["grid"], want["grid"])  # NaN equals NaN here
            assert got["grid"].dtype == np.float64
        finally:
            remote.close()
            here.close()


async def test_an_environment_whose_session_the_server_ended_is_named_at_every_call() -> None:
    # Its step overran the server's step_timeout, so the server ended its session;
    # the calls after must say so, not ask the user to "send an 'open' request".
    gate = threading.Event()
    app = create_gymnasium_app(
        lambda: Gated(gate), ConcurrencyConfig(max_concurrent_envs=4), step_timeout=0.5
    )
    with run_server(app) as url:
        envs = RemoteVectorEnv(url, num_envs=3)
        try:
            envs.reset(seed=0)
            with pytest.raises(DeadlineError) as caught:
                envs.step(np.array([0, 1, 0]))
            assert caught.value.fatal
            ended = r"the server ended the session of environment 1 \(\[TIMEOUT\] step\(\)"
            for _ in range(2):
                with pytest.raises(SessionClosedError, match=ended):
                    envs.step(np.array([0, 0, 0]))
            with pytest.raises(SessionClosedError, match=ended):
                envs.reset(seed=1)
        finally:
            gate.set()
            envs.close()
        await slots_free(url)
