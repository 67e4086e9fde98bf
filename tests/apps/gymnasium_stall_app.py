"""Gymnasium apps for the killed-server tests: action 1 touches the file named by
``$OPENENV_TEST_STEPPING`` and never returns; action 0 steps at once."""

import os
import threading
from typing import Any

import gymnasium
import numpy as np

from openenv import ConcurrencyConfig
from openenv.adapters.gymnasium import create_gymnasium_app, create_gymnasium_vector_app

STEPPING = os.environ["OPENENV_TEST_STEPPING"]


class Stall(gymnasium.Env[np.ndarray, np.int64]):
    action_space = gymnasium.spaces.Discrete(2)
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.int64) -> Any:
        if action == 1:
            with open(STEPPING, "w"):
                pass
            threading.Event().wait()  # until the process is killed
        return np.zeros(1, np.float32), 1.0, False, False, {}


app = create_gymnasium_app(Stall, ConcurrencyConfig(max_concurrent_envs=8))
vector_app = create_gymnasium_vector_app(Stall, ConcurrencyConfig(max_concurrent_envs=8))
