"""``openenv.core.env_server.interfaces``: OpenEnv 0.10's ``Environment``, on openenv's.

An environment written for OpenEnv subclasses this ``Environment``, and is
served as OpenEnv's server serves it: its ``reset_async`` / ``step_async`` are
what a session calls when it overrides them (else ``reset`` / ``step``, in a
worker thread), and reset arguments its method does not take are dropped
rather than refused. OpenEnv's constructor (``transform=``, ``rubric=``) and
its helpers for them are here too.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Any, Generic, Protocol, TypedDict, TypeVar

from openenv.core._models import Action, Observation, State
from openenv.core.env_server.task_api import TaskProvider, wrap_task_methods
from openenv.environment import Environment as _Environment
from openenv.types import EnvironmentMetadata

__all__ = ["Environment", "Message", "ModelTokenizer", "TaskProvider", "Transform"]

ActT = TypeVar("ActT", bound=Action)
ObsT = TypeVar("ObsT", bound=Observation)
StateT = TypeVar("StateT", bound=State)


class Message(TypedDict):
    """A chat message, as OpenEnv's chat environments pass them."""

    role: str
    content: str


class ModelTokenizer(Protocol):
    """What OpenEnv's chat environments need of a tokenizer (a ``transformers`` one fits)."""

    def apply_chat_template(
        self,
        conversation: list[Message],
        tokenize: bool = True,
        return_tensors: str | None = None,
        **kwargs: Any,
    ) -> Any: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str: ...


class Transform(ABC, Generic[ObsT]):
    """OpenEnv's observation transform: ``Environment(transform=...)`` applies it."""

    @abstractmethod
    def __call__(self, observation: ObsT) -> ObsT:
        """The observation, transformed (a reward added, fields filled in, ...)."""


class Environment(_Environment[ActT, ObsT, StateT]):
    """OpenEnv's environment base class; see the module docstring.

    >>> from openenv.core.env_server.interfaces import Environment
    >>> from openenv.core.env_server.types import Observation, State
    >>> class Ticks(Environment):
    ...     def reset(self, seed=None, episode_id=None, **kwargs):
    ...         return Observation()
    ...     def step(self, action, timeout_s=None, **kwargs):
    ...         return Observation(reward=1.0)
    ...     async def step_async(self, action, timeout_s=None, **kwargs):
    ...         return Observation(reward=2.0)
    ...     @property
    ...     def state(self):
    ...         return State()
    >>> Ticks._server_reset, Ticks._server_step
    ('reset', 'step_async')
    """

    _drops_unknown_reset_kwargs = True
    _server_metadata = False

    def __init__(self, transform: Any = None, rubric: Any = None) -> None:
        self.transform = transform
        self.rubric = rubric

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # OpenEnv's server awaits the async variant only where a class overrides it.
        if cls.reset_async is not Environment.reset_async:
            cls._server_reset = "reset_async"
        if cls.step_async is not Environment.step_async:
            cls._server_step = "step_async"
        # And /metadata is what its get_metadata says, where it says anything.
        if cls.get_metadata is not Environment.get_metadata:
            cls._server_metadata = True
        # And its task API may be instance methods, which openenv's routes call on the class.
        wrap_task_methods(cls)

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> Any:
        """``reset``, awaitable; override it for an environment that resets asynchronously."""
        return self.reset(seed=seed, episode_id=episode_id, **kwargs)

    async def step_async(self, action: ActT, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """``step``, awaitable; override it for an environment that steps asynchronously."""
        return self.step(action, timeout_s=timeout_s, **kwargs)

    def get_metadata(self) -> EnvironmentMetadata:
        """OpenEnv's default: the class's name (openenv's ``/metadata`` is ``create_app``'s)."""
        name = type(self).__name__
        return EnvironmentMetadata(name=name, description=f"{name} environment", version="1.0.0")

    def _apply_transform(self, observation: ObsT) -> ObsT:
        transformed: ObsT = (
            self.transform(observation) if self.transform is not None else observation
        )
        return transformed

    def _apply_rubric(self, action: ActT, observation: ObsT) -> float:
        return float(self.rubric(action, observation)) if self.rubric is not None else 0.0

    async def _apply_rubric_async(self, action: ActT, observation: ObsT) -> float:
        if self.rubric is None:
            return 0.0
        score = self.rubric(action, observation)
        return float(await score if inspect.isawaitable(score) else score)

    def _reset_rubric(self) -> None:
        if self.rubric is not None:
            self.rubric.reset()

    async def _reset_rubric_async(self) -> None:
        if self.rubric is None:
            return
        reset = getattr(self.rubric, "reset_async", None) or self.rubric.reset
        done = reset()
        if inspect.isawaitable(done):
            await done
