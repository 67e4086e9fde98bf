"""One remote Gymnasium environment behind Gymnasium's own ``Env`` API."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from openenv.adapters.gymnasium.vector import RemoteVectorEnv

__all__ = ["RemoteGymnasiumEnv"]


class RemoteGymnasiumEnv(gymnasium.Env[Any, Any]):
    """One remote environment behind Gymnasium's ``Env`` API (a ``RemoteVectorEnv``
    of one, without autoreset): code written for ``gymnasium.make(...)`` runs on it.

    >>> from gymnasium.utils.env_checker import check_env
    >>> def check(url: str) -> None:
    ...     env = RemoteGymnasiumEnv(url)  # e.g. envs/gymnasium_env serving CartPole-v1
    ...     observation, info = env.reset(seed=0)
    ...     observation, reward, terminated, truncated, info = env.step(env.action_space.sample())
    ...     check_env(env, skip_render_check=True)  # Gymnasium's own checker
    """

    def __init__(self, base_url: str, **options: Any) -> None:
        self._vector = RemoteVectorEnv(
            base_url, 1, autoreset_mode=AutoresetMode.DISABLED, **options
        )
        self.action_space = self._vector.single_action_space
        self.observation_space = self._vector.single_observation_space
        self._batch: Any = create_empty_array(self.action_space, 1)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        observations, infos = self._vector.reset(seed=[seed], options=options)
        return _first(self.observation_space, observations), _first_info(infos)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        actions = concatenate(self.action_space, [action], self._batch)
        observations, rewards, terminations, truncations, infos = self._vector.step(actions)
        return (
            _first(self.observation_space, observations),
            float(rewards[0]),
            bool(terminations[0]),
            bool(truncations[0]),
            _first_info(infos),
        )

    def close(self) -> None:
        self._vector.close()


def _first(space: gymnasium.Space[Any], batched: Any) -> Any:
    """Environment 0's value of a batch of one, arrays as arrays: ``iterate`` gives a
    0-d ``Box``'s value as a numpy scalar, where the environment gave a 0-d array."""
    spaces = gymnasium.spaces
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        return np.array(batched[0], dtype=space.dtype)
    if isinstance(space, spaces.Dict):
        return {key: _first(sub, batched[key]) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_first(sub, item) for sub, item in zip(space, batched, strict=True))
    return next(iter(iterate(batch_space(space, 1), batched)))


def _first_info(infos: dict[str, Any]) -> dict[str, Any]:
    """Environment 0's info from a vector env's batched infos (arrays with ``_key`` masks)."""
    info = {}
    for key, value in infos.items():
        if key.startswith("_") or not infos.get(f"_{key}", [False])[0]:
            continue
        info[key] = _first_info(value) if isinstance(value, dict) else value[0]
    return info
