"""RemoteVectorEnv against environments that misbehave, each beside the same
environments in a ``SyncVectorEnv``: the spec for what the batch does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from openenv import ConcurrencyConfig
from openenv.adapters.gymnasium import (
    RemoteVectorEnv,
    create_gymnasium_app,
    create_gymnasium_vector_app,
)
from openenv.testing import run_server

MAKERS = [create_gymnasium_app, create_gymnasium_vector_app]


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
