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
(array([1., 1., 1.]), array([False, False, False]))
>>> env.close()
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from pydantic import AfterValidator, Field, PlainSerializer, WithJsonSchema, create_model

from openenv.adapters.gymnasium.environment import EnvSource, _make, serve_spaces
from openenv.adapters.gymnasium.spaces import jsonable
from openenv.environment import Environment
from openenv.errors import EnvError
from openenv.protocol import reward_value
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


def _listed(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


# A batch: a numpy array as the environment made it (a list once validated from
# JSON); a JSON array, one entry per environment, on the wire.
_Batch = Annotated[
    Any,
    PlainSerializer(_listed, when_used="json"),
    WithJsonSchema({"type": "array", "description": "One entry per environment."}),
]


class VectorObservation(Observation):
    """What ``SyncVectorEnv.reset``/``step`` return: arrays, one entry per environment.

    ``reward`` and ``done`` (the envelope's) stay empty: a batch has one of each per
    environment, in ``rewards``, ``terminations`` and ``truncations``. Reply frames
    take the arrays as they are (``dump_mode``): orjson writes them, float32 as
    float32, with no ``tolist()`` and no per-item pass of pydantic's.
    """

    dump_mode = "python"

    observations: _Batch = Field(default_factory=list)
    rewards: _Batch = Field(default_factory=list)
    terminations: _Batch = Field(default_factory=list)
    truncations: _Batch = Field(default_factory=list)
    infos: dict[str, Any] = Field(default_factory=dict, description="The batched info dict.")


def _batch(
    observations: Any,
    infos: dict[str, Any],
    rewards: Any = (),
    terminations: Any = (),
    truncations: Any = (),
) -> VectorObservation:
    # Every field given: model_construct looks up a missing one's default factory's
    # signature on every call (pydantic 2.12), which costs more than the rest.
    return VectorObservation.model_construct(
        observations=observations,
        rewards=rewards,
        terminations=terminations,
        truncations=truncations,
        infos=jsonable(infos) if infos else {},
        reward=None,
        done=False,
        metadata={},
    )


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
            # Copies (SyncVectorEnv's default): an observation holds the array itself,
            # which no later step may overwrite before every transport has encoded it.
            self.vector = SyncVectorEnv([self._make] * num_envs, autoreset_mode=mode)
            self._shape = (num_envs, mode.value)
        options = dict(options or {})
        if "reset_mask" in options:
            options["reset_mask"] = np.asarray(options["reset_mask"], dtype=np.bool_)
        if seeds is not None and len(seeds) != num_envs:
            raise EnvError(f"{len(seeds)} seeds for num_envs={num_envs}")
        chosen = seeds if seeds is not None else seed
        if any(s is not None and s < 0 for s in (seeds or [seed])):
            raise EnvError(f"seeds must be 0 or more, got {chosen}")  # as Gymnasium's seeding
        try:
            observations, infos = self.vector.reset(seed=chosen, options=options or None)
        except BaseException:
            # Its environments may be left half reset, and Gymnasium's own checker
            # wrappers broken for good (every later step raises TypeError): the
            # next reset makes new ones, and no step goes on meanwhile.
            self.vector.close()
            self.vector, self._shape = None, (0, "")
            raise
        self._steps = 0
        return _batch(observations, infos)

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
        sent: Any = rewards
        if not np.isfinite(rewards).all():  # orjson would write null: the frame's spelling
            sent = [reward_value(float(reward)) for reward in rewards]
        return _batch(observations, infos, sent, terminations, truncations)

    @property
    def state(self) -> State:
        return State(step_count=self._steps)

    def close(self) -> None:
        if self.vector is not None:
            self.vector.close()


def vector_action_model(space: gymnasium.Space[Any], name: str) -> type[VectorAction]:
    """``VectorAction`` whose ``actions`` must all be values of ``space`` (else the
    client gets ``VALIDATION_ERROR``, as a session of ``create_gymnasium_app`` does)."""
    kinds = _kinds(space)
    in_space = _in_space(space)
    shape: tuple[int, ...] = space.shape or ()

    def check(values: list[Any]) -> list[Any]:
        try:
            array = np.asarray(values)
        except (TypeError, ValueError):  # ragged
            array = np.empty(0, dtype=object)
        if array.dtype.kind not in kinds or array.shape != (len(values), *shape):
            raise ValueError(f"the actions are not values of {space}")
        if values and not in_space(array):
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


def _kinds(space: gymnasium.Space[Any]) -> str:
    """The array kinds (numpy's ``dtype.kind``) a batch of actions may have: integers
    (and booleans, which Python counts as integers) for an integer space (0.5 is no
    ``Discrete`` action), any number for a float ``Box``."""
    if isinstance(space, gymnasium.spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return "iufb"
    return "iub"


def _in_space(space: gymnasium.Space[Any]) -> Callable[[np.ndarray[Any, Any]], bool]:
    """Whether a batch of values (one row per environment) lies within ``space``'s
    bounds: one pass of numpy over the batch, as ``batch_space(space, n).contains``
    makes with several checks more around it."""
    if isinstance(space, gymnasium.spaces.Discrete):
        first, last = int(space.start), int(space.start) + int(space.n) - 1
        return lambda batch: bool(first <= batch.min() and batch.max() <= last)
    if isinstance(space, gymnasium.spaces.MultiDiscrete):
        start, top = space.start, space.start + (space.nvec - 1)
        return lambda batch: bool(np.all(start <= batch) and np.all(batch <= top))
    if isinstance(space, gymnasium.spaces.MultiBinary):
        return lambda batch: bool(np.all((batch == 0) | (batch == 1)))
    assert isinstance(space, gymnasium.spaces.Box)
    low, high = space.low, space.high
    return lambda batch: bool(np.all(low <= batch) and np.all(batch <= high))


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
