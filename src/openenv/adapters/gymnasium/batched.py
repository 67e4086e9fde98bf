"""Vector sessions: one session steps ``num_envs`` copies of an environment in one call.

``create_gymnasium_app`` gives each environment a session of its own, so a
``RemoteVectorEnv`` of 64 pays 64 sessions' work per step on the server (an
action to validate, an observation to encode, the bookkeeping): several
times what CartPole's own step costs. ``create_gymnasium_vector_app``
serves the other way round, as EnvPool does in process: a session holds a
``gymnasium.vector.SyncVectorEnv`` of as many copies as its client asks for
at reset, takes all their actions as one list, and answers with their
observations, rewards, terminations and truncations as arrays. The same
``RemoteVectorEnv(url, num_envs=64)`` drives either server: it reads which
kind it is from ``GET /gymnasium/spaces``.

What a vector session gives up: its environments live together on one
server and step in lockstep (one slow environment holds back its batch, as
in a ``SyncVectorEnv``); the server's cap counts the session, not its
environments (``max_envs`` bounds those). Spaces must be arrays (``Box``,
``Discrete``, ``MultiDiscrete``, ``MultiBinary``).

>>> from openenv.adapters.gymnasium.batched import GymnasiumVectorEnvironment
>>> env = GymnasiumVectorEnvironment("CartPole-v1")
>>> first = env.reset(seed=42, num_envs=3)
>>> len(first.observations), len(first.observations[0])
(3, 4)
>>> result = env.step(VectorAction(actions=[0, 1, 1]))
>>> result.rewards, result.terminations
([1.0, 1.0, 1.0], [False, False, False])
>>> env.close()
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space
from pydantic import AfterValidator, Field, create_model

from openenv.adapters.gymnasium.environment import EnvSource, _make, serve_spaces
from openenv.adapters.gymnasium.spaces import jsonable
from openenv.environment import Environment
from openenv.errors import EnvError
from openenv.types import Action, EnvironmentMetadata, Observation, State

if TYPE_CHECKING:
    from fastapi import FastAPI

    from openenv.server import ConcurrencyConfig

__all__ = [
    "DEFAULT_MAX_ENVS",
    "GymnasiumVectorEnvironment",
    "VectorAction",
    "VectorObservation",
    "create_gymnasium_vector_app",
    "vector_action_model",
]

DEFAULT_MAX_ENVS = 1024

_ARRAY_SPACES = (
    gymnasium.spaces.Box,
    gymnasium.spaces.Discrete,
    gymnasium.spaces.MultiDiscrete,
    gymnasium.spaces.MultiBinary,
)


class VectorAction(Action):
    """One action per environment of the session, in order."""

    # Whether validation already checked every action against the space
    # (``vector_action_model``'s models do); the environment checks them otherwise.
    in_space: ClassVar[bool] = False

    actions: list[Any] = Field(description="An action of the action space for each environment.")


class VectorObservation(Observation):
    """What ``SyncVectorEnv.reset``/``step`` return, as JSON arrays (one entry per environment).

    ``reward`` and ``done`` (the envelope's) stay empty: a batch has one of each per
    environment, in ``rewards``, ``terminations`` and ``truncations``.
    """

    observations: list[Any] = Field(default_factory=list)
    rewards: list[float] = Field(default_factory=list)
    terminations: list[bool] = Field(default_factory=list)
    truncations: list[bool] = Field(default_factory=list)
    infos: dict[str, Any] = Field(default_factory=dict, description="The batched info dict.")


class GymnasiumVectorEnvironment(Environment[VectorAction, VectorObservation, State]):
    """A ``SyncVectorEnv`` behind openenv's ``reset``/``step``; its size is set at reset.

    Args:
        env: A registered id for ``gymnasium.make`` or a factory of environments.
        max_envs: The most environments a session may ask for.
        **make_kwargs: Passed to ``gymnasium.make`` with an id.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self, env: EnvSource, max_envs: int = DEFAULT_MAX_ENVS, **make_kwargs: Any
    ) -> None:
        self._make = functools.partial(_make, env, make_kwargs)
        self.max_envs = max_envs
        self.vector: SyncVectorEnv | None = None
        self._shape: tuple[int, str] = (0, "")
        self._steps = 0

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        num_envs: int = 1,
        autoreset_mode: str = AutoresetMode.NEXT_STEP.value,
        seeds: list[int | None] | None = None,
        **kwargs: Any,
    ) -> VectorObservation:
        """(Re)make the vector of ``num_envs`` environments if it changed, and reset it.

        ``seed`` seeds environment ``i`` with ``seed + i`` (as ``SyncVectorEnv``);
        ``seeds`` gives each its own.
        """
        if not 1 <= num_envs <= self.max_envs:
            raise EnvError(f"num_envs must be between 1 and {self.max_envs}, got {num_envs}")
        try:
            mode = AutoresetMode(autoreset_mode)
        except ValueError:
            modes = ", ".join(m.value for m in AutoresetMode)
            raise EnvError(
                f"autoreset_mode must be one of {modes}, got {autoreset_mode!r}"
            ) from None
        if self.vector is None or self._shape != (num_envs, mode.value):
            if self.vector is not None:
                self.vector.close()
            # copy=False: each reply is encoded before the next step reuses the buffer.
            self.vector = SyncVectorEnv([self._make] * num_envs, autoreset_mode=mode, copy=False)
            self._shape = (num_envs, mode.value)
        options = dict(options or {})
        if "reset_mask" in options:
            options["reset_mask"] = np.asarray(options["reset_mask"], dtype=np.bool_)
        if seeds is not None and len(seeds) != num_envs:
            raise EnvError(f"{len(seeds)} seeds for num_envs={num_envs}")
        chosen = seeds if seeds is not None else seed
        observations, infos = self.vector.reset(seed=chosen, options=options or None)
        self._steps = 0
        return VectorObservation.model_construct(
            observations=observations.tolist(), infos=jsonable(infos)
        )

    def step(self, action: VectorAction, **kwargs: Any) -> VectorObservation:
        vector = self.vector
        if vector is None:
            raise EnvError("reset() before the first step")
        if len(action.actions) != vector.num_envs:
            raise EnvError(f"{len(action.actions)} actions for {vector.num_envs} environments")
        space = vector.action_space
        try:
            actions = np.asarray(action.actions, dtype=space.dtype).reshape(space.shape)
        except (TypeError, ValueError) as exc:
            raise EnvError(
                f"actions are not values of {vector.single_action_space}: {exc}"
            ) from None
        if not action.in_space and not space.contains(actions):
            raise EnvError(f"actions outside the action space {vector.single_action_space}")
        observations, rewards, terminations, truncations, infos = vector.step(actions)
        self._steps += 1
        return VectorObservation.model_construct(
            observations=observations.tolist(),
            rewards=rewards.tolist(),
            terminations=terminations.tolist(),
            truncations=truncations.tolist(),
            infos=jsonable(infos) if infos else {},
        )

    @property
    def state(self) -> State:
        return State(step_count=self._steps)

    def close(self) -> None:
        if self.vector is not None:
            self.vector.close()


def vector_action_model(space: gymnasium.Space[Any], name: str) -> type[VectorAction]:
    """``VectorAction`` whose ``actions`` must all be values of ``space`` (else the
    client gets ``VALIDATION_ERROR``, as a session of ``create_gymnasium_app`` does)."""

    @functools.lru_cache(maxsize=8)
    def batched(count: int) -> gymnasium.Space[Any]:
        return batch_space(space, count)

    def check(values: list[Any]) -> list[Any]:
        try:
            shape: tuple[int, ...] = (len(values), *(space.shape or ()))
            array = np.asarray(values, dtype=space.dtype).reshape(shape)
        except (TypeError, ValueError):
            raise ValueError(f"the actions are not values of {space}") from None
        if not batched(len(values)).contains(array):
            raise ValueError(f"the actions are not all in the action space {space}")
        return values

    model: type[VectorAction] = create_model(
        f"{name}VectorAction",
        __base__=VectorAction,
        __doc__=f"One action of {space} per environment of the session.",
        actions=(
            Annotated[list[Any], AfterValidator(check)],
            Field(description=f"An action of {space} for each environment, in order."),
        ),
    )
    model.in_space = True
    return model


def create_gymnasium_vector_app(
    env: EnvSource,
    concurrency: ConcurrencyConfig | None = None,
    *,
    max_envs: int = DEFAULT_MAX_ENVS,
    make_kwargs: dict[str, Any] | None = None,
    **settings: Any,
) -> FastAPI:
    """An app whose sessions are vectors of ``env`` (``create_app``'s settings apply).

    >>> app = create_gymnasium_vector_app("CartPole-v1", max_envs=256)
    >>> app.title
    'CartPole-v1 (vector)'
    """
    from openenv.server import create_app

    make_kwargs = make_kwargs or {}
    probe = _make(env, make_kwargs)
    try:
        spaces = {"action_space": probe.action_space, "observation_space": probe.observation_space}
        for role, space in spaces.items():
            if not isinstance(space, _ARRAY_SPACES):
                raise TypeError(
                    f"a vector app needs array spaces; the {role} is {space!r} "
                    "(serve it with create_gymnasium_app)"
                )
        name = env if isinstance(env, str) else type(probe.unwrapped).__name__
    finally:
        probe.close()
    metadata = EnvironmentMetadata(
        name=f"{name} (vector)",
        description=(
            f"Gymnasium environment {name}, up to {max_envs} copies per session stepped "
            f"together: actions {spaces['action_space']}, observations "
            f"{spaces['observation_space']}"
        ),
        supports_concurrent_sessions=True,
    )
    factory = functools.partial(GymnasiumVectorEnvironment, env, max_envs, **make_kwargs)
    action_cls = vector_action_model(spaces["action_space"], re.sub(r"\W", "", name))
    app = create_app(
        factory, action_cls, VectorObservation, concurrency, metadata=metadata, **settings
    )
    serve_spaces(
        app,
        name,
        spaces["action_space"],
        spaces["observation_space"],
        vector={"max_envs": max_envs},
    )
    return app
