"""Serve a Gymnasium environment: one ``gymnasium.Env`` per session.

>>> from openenv.adapters.gymnasium import GymnasiumEnvironment
>>> env = GymnasiumEnvironment("CartPole-v1")
>>> first = env.reset(seed=42)
>>> len(first.observation), first.done
(4, False)
>>> result = env.step(env.models.action_cls(action=1))
>>> result.reward, result.terminated, result.truncated
(1.0, False, False)
>>> env.close()
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium
from pydantic import Field, ValidationError, create_model

from openenv.adapters.gymnasium.frames import png_data_url
from openenv.adapters.gymnasium.spaces import (
    action_annotation,
    annotation,
    describe,
    from_json,
    jsonable,
    to_json,
)
from openenv.environment import Environment
from openenv.errors import EnvError
from openenv.types import Action, EnvironmentMetadata, Observation, State

if TYPE_CHECKING:
    from fastapi import FastAPI

    from openenv.server import ConcurrencyConfig

__all__ = [
    "SPACES_ROUTE",
    "EnvSource",
    "GymnasiumAction",
    "GymnasiumEnvironment",
    "GymnasiumModels",
    "GymnasiumObservation",
    "GymnasiumState",
    "create_gymnasium_app",
    "gymnasium_models",
    "serve_spaces",
]

# Where a Gymnasium app says what its spaces are (``spaces.describe``).
SPACES_ROUTE = "/gymnasium/spaces"

EnvSource = str | Callable[[], gymnasium.Env[Any, Any]]
"""A registered environment id (``"CartPole-v1"``) or a zero-argument factory."""


class GymnasiumAction(Action):
    """Base of the action models derived from action spaces: one field, ``action``."""


class GymnasiumObservation(Observation):
    """Base of the observation models derived from observation spaces.

    ``done`` is ``terminated or truncated``; both are kept, since a truncated
    episode (a time limit) must be bootstrapped and a terminated one not.
    """

    terminated: bool = Field(default=False, description="The MDP reached a terminal state.")
    truncated: bool = Field(default=False, description="The episode was cut short (time limit).")
    info: dict[str, Any] = Field(default_factory=dict, description="The step's info dict.")
    frame: str | None = Field(
        default=None,
        description=(
            "The rendered frame as a PNG data URL, when the environment was made with "
            'render_mode="rgb_array"; else null.'
        ),
    )


class GymnasiumState(State):
    """The episode's bookkeeping."""

    env_id: str = ""
    total_reward: float = 0.0
    terminated: bool = False
    truncated: bool = False


@dataclass(frozen=True)
class GymnasiumModels:
    """The action and observation models of one environment, made from its spaces."""

    name: str
    action_cls: type[GymnasiumAction]
    observation_cls: type[GymnasiumObservation]
    action_space: gymnasium.Space[Any]
    observation_space: gymnasium.Space[Any]


def gymnasium_models(
    env: EnvSource | gymnasium.Env[Any, Any], **make_kwargs: Any
) -> GymnasiumModels:
    """Derive the action and observation models of ``env`` from its spaces.

    Clients use it to get typed models; it makes (and closes) one instance
    unless given one.

    >>> models = gymnasium_models("Pendulum-v1")
    >>> models.action_cls.__name__, models.action_cls(action=[1.5]).action
    ('PendulumAction', [1.5])
    >>> models.action_cls.model_json_schema()["properties"]["action"]["items"]
    {'maximum': 2.0, 'minimum': -2.0, 'type': 'number'}
    """
    if isinstance(env, gymnasium.Env):
        return _derive(env)
    instance = _make(env, make_kwargs)
    try:
        return _derive(instance)
    finally:
        instance.close()


class GymnasiumEnvironment(Environment[GymnasiumAction, GymnasiumObservation, GymnasiumState]):
    """A Gymnasium environment behind openenv's ``reset``/``step``.

    Args:
        env: A registered id for ``gymnasium.make`` or a factory of environments.
        models: The models to answer with (``create_gymnasium_app`` derives
            them once for all sessions); derived from the spaces when omitted.
        **make_kwargs: Passed to ``gymnasium.make`` with an id.
    """

    # Each session makes its own gymnasium.Env. An environment built on a shared
    # global simulator is not safe this way: subclass and set this to False.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self, env: EnvSource, models: GymnasiumModels | None = None, **make_kwargs: Any
    ) -> None:
        self._remake = functools.partial(_make, env, make_kwargs)
        self.env = self._remake()
        self._stale = False
        self.models = models or _derive(self.env)
        # Frames only when asked for: rendering and encoding cost more than a step.
        self._renders = self.env.render_mode == "rgb_array"
        # The episode's bookkeeping as plain attributes (a pydantic model's setters
        # cost more than a CartPole step); ``state`` makes the model when asked.
        self._env_id = _env_id(self.env)
        self._episode_id: str | None = None
        self._steps = 0
        self._total_reward = 0.0
        self._terminated = self._truncated = False
        self._needs_reset = True

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> GymnasiumObservation:
        """Start an episode; the same ``seed`` gives the same episode for the same actions."""
        if seed is not None and seed < 0:  # Gymnasium's seeding refuses it, less clearly
            raise EnvError(f"seed must be 0 or more, got {seed}")
        if self._stale:
            self.env.close()
            self.env = self._remake()
            self._stale = False
        try:
            observation, info = self.env.reset(seed=seed, options=options)
        except BaseException:
            # The environment may be left half reset, and Gymnasium's own checker
            # wrapper broken for good (every later step raises TypeError): the
            # next reset starts from a new one, and no step goes on meanwhile.
            self._stale = self._needs_reset = True
            raise
        self._episode_id = episode_id or uuid.uuid4().hex
        self._steps, self._total_reward = 0, 0.0
        self._terminated = self._truncated = False
        self._needs_reset = False
        return self._observation(observation, info)

    def step(self, action: GymnasiumAction, **kwargs: Any) -> GymnasiumObservation:
        if self._needs_reset:
            raise EnvError(
                "the episode is over (terminated or truncated); reset() to start a new one"
                if self._steps
                else "reset() before the first step"
            )
        value = from_json(self.models.action_space, jsonable(getattr(action, "action", None)))
        observation, reward, terminated, truncated, info = self.env.step(value)
        try:
            reward = float(reward)
        except (TypeError, ValueError):  # said to the client, not only to the server's log
            raise EnvError(
                f"{self._env_id} returned the reward {reward!r:.80}, not a number"
            ) from None
        terminated, truncated = bool(terminated), bool(truncated)
        self._steps += 1
        self._total_reward += reward
        self._terminated, self._truncated = terminated, truncated
        self._needs_reset = terminated or truncated
        return self._observation(observation, info, reward, terminated, truncated)

    @property
    def state(self) -> GymnasiumState:
        return GymnasiumState(
            episode_id=self._episode_id,
            step_count=self._steps,
            env_id=self._env_id,
            total_reward=self._total_reward,
            terminated=self._terminated,
            truncated=self._truncated,
        )

    def close(self) -> None:
        self.env.close()

    def _observation(
        self,
        observation: Any,
        info: dict[str, Any],
        reward: float | None = None,
        terminated: bool = False,
        truncated: bool = False,
    ) -> GymnasiumObservation:
        space = self.models.observation_space
        try:
            return self.models.observation_cls.model_validate(
                {
                    "observation": to_json(space, observation),
                    "info": jsonable(info),
                    "terminated": terminated,
                    "truncated": truncated,
                    "reward": reward,
                    "done": terminated or truncated,
                    "frame": png_data_url(self.env.render()) if self._renders else None,
                }
            )
        except ValidationError as exc:  # said to the client, not only to the server's log
            error = exc.errors(include_url=False)[0]
            where = ".".join(map(str, error["loc"]))
            raise EnvError(
                f"{self._env_id} returned an {where} that does not fit {space}: {error['msg']}"
            ) from None


def create_gymnasium_app(
    env: EnvSource,
    concurrency: ConcurrencyConfig | None = None,
    *,
    make_kwargs: dict[str, Any] | None = None,
    **settings: Any,
) -> FastAPI:
    """An app that serves ``env``, one instance per session (``create_app``'s settings apply).

    >>> from openenv import ConcurrencyConfig
    >>> app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=64))
    >>> app.title
    'CartPole-v1'
    """
    from openenv.server import create_app

    make_kwargs = make_kwargs or {}
    models = gymnasium_models(env, **make_kwargs)
    factory = functools.partial(GymnasiumEnvironment, env, models, **make_kwargs)
    space = f"actions {models.action_space}, observations {models.observation_space}"
    metadata = EnvironmentMetadata(
        name=env if isinstance(env, str) else models.name,
        description=f"Gymnasium environment {models.name}: {space}",
        supports_concurrent_sessions=GymnasiumEnvironment.SUPPORTS_CONCURRENT_SESSIONS,
    )
    app = create_app(
        factory,
        models.action_cls,
        models.observation_cls,
        concurrency,
        state_cls=GymnasiumState,
        metadata=metadata,
        **settings,
    )
    serve_spaces(app, metadata.name, models.action_space, models.observation_space)
    return app


def serve_spaces(
    app: FastAPI,
    name: str,
    action_space: gymnasium.Space[Any],
    observation_space: gymnasium.Space[Any],
    **extra: Any,
) -> None:
    """Say at ``SPACES_ROUTE`` what the spaces are, for clients that rebuild them
    (``RemoteVectorEnv``); ``extra`` adds facts (a vector app's ``max_envs``)."""
    described = {
        "name": name,
        "action_space": describe(action_space),
        "observation_space": describe(observation_space),
        **extra,
    }

    async def gymnasium_spaces() -> dict[str, Any]:
        return described

    app.add_api_route(SPACES_ROUTE, gymnasium_spaces, methods=["GET"], tags=["gymnasium"])


def _make(env: EnvSource, make_kwargs: dict[str, Any]) -> gymnasium.Env[Any, Any]:
    if isinstance(env, str):
        return gymnasium.make(env, **make_kwargs)
    if make_kwargs:
        raise TypeError("make_kwargs only apply to an environment id, not to a factory")
    made = env()
    if not isinstance(made, gymnasium.Env):
        raise TypeError(f"the factory {env!r} returned {type(made).__name__}, not a gymnasium.Env")
    return made


def _env_id(env: gymnasium.Env[Any, Any]) -> str:
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__


def _derive(env: gymnasium.Env[Any, Any]) -> GymnasiumModels:
    name = re.sub(
        r"\W", "", env.spec.name if env.spec is not None else type(env.unwrapped).__name__
    )
    action_space, observation_space = env.action_space, env.observation_space
    action_type = action_annotation(action_space, name=f"{name}ActionValue")
    action_cls = create_model(
        f"{name}Action",
        __base__=GymnasiumAction,
        __doc__=f"An action of {name}: a value of {action_space}.",
        action=(action_type, Field(description=f"A value of the action space {action_space}.")),
    )
    observation_type = annotation(observation_space, enforce=False, name=f"{name}ObservationValue")
    observation_cls = create_model(
        f"{name}Observation",
        __base__=GymnasiumObservation,
        __doc__=f"An observation of {name}: a value of {observation_space}.",
        observation=(
            observation_type,
            Field(description=f"A value of the observation space {observation_space}."),
        ),
    )
    return GymnasiumModels(name, action_cls, observation_cls, action_space, observation_space)
