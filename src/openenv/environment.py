"""The ``Environment`` base class that environment authors subclass."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Generic, Literal, TypeVar

from openenv.tasks import TaskSpec
from openenv.types import Action, Observation, State

__all__ = ["Environment"]

ActT = TypeVar("ActT", bound=Action)
ObsT = TypeVar("ObsT", bound=Observation)
StateT = TypeVar("StateT", bound=State)


class Environment(Generic[ActT, ObsT, StateT]):
    """One episode-playing instance, owned by exactly one session.

    ``reset``, ``step`` and ``close`` may each be ``def`` or ``async def``.
    The server awaits an ``async def`` on its event loop and runs a plain
    ``def`` in a worker thread, so a slow or blocking environment never stalls
    other sessions. Calls of one session never overlap.

    Set ``SUPPORTS_CONCURRENT_SESSIONS = True`` only when many instances can
    live in one process at once (no shared mutable globals); the server
    refuses to start with ``max_concurrent_envs > 1`` otherwise.

    >>> from openenv import Action, Observation, State
    >>> class Add(Action):
    ...     n: int
    >>> class Total(Observation):
    ...     total: int
    >>> class Adder(Environment[Add, Total, State]):
    ...     SUPPORTS_CONCURRENT_SESSIONS = True
    ...     def reset(self, seed=None, episode_id=None, **kwargs):
    ...         self._state = State(episode_id=episode_id)
    ...         self.total = 0
    ...         return Total(total=0)
    ...     def step(self, action, **kwargs):
    ...         self.total += action.n
    ...         self._state.step_count += 1
    ...         return Total(total=self.total, reward=float(action.n), done=self.total >= 10)
    ...     @property
    ...     def state(self):
    ...         return self._state
    >>> env = Adder()
    >>> env.reset().total
    0
    >>> env.step(Add(n=10)).done
    True
    """

    SUPPORTS_CONCURRENT_SESSIONS: ClassVar[bool] = False
    # What a server calls for reset and step, and whether reset arguments the
    # method does not take are dropped (else refused). OpenEnv's Environment
    # (openenv.core.env_server.interfaces) sets them as OpenEnv's server behaves.
    _server_reset: ClassVar[str] = "reset"
    _server_step: ClassVar[str] = "step"
    _drops_unknown_reset_kwargs: ClassVar[bool] = False

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> ObsT | Awaitable[ObsT]:
        """Start a new episode and return its first observation."""
        raise NotImplementedError(f"{type(self).__name__} must implement reset()")

    def step(self, action: ActT, **kwargs: Any) -> ObsT | Awaitable[ObsT]:
        """Apply one action and return the resulting observation."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    @property
    def state(self) -> StateT:
        """The current episode's state (``episode_id``, ``step_count``, ...)."""
        raise NotImplementedError(f"{type(self).__name__} must implement the state property")

    def close(self) -> Awaitable[None] | None:
        """Release what the instance holds; called exactly once per instance."""
        return None

    # -- tasks (optional): class-level, so they can be listed without an instance --

    @classmethod
    def list_splits(cls) -> Sequence[str]:
        """The names of this environment's task splits, e.g. ``("train", "test")``."""
        return ()

    @classmethod
    def list_tasks(cls, split: str) -> Sequence[TaskSpec]:
        """The tasks of ``split``, in a stable order; ``split`` is one of ``list_splits()``.

        Any ``Sequence`` will do: a large split can compute its items on
        demand (``__len__`` and ``__getitem__``), since the server only reads
        the page a client asks for.
        """
        return ()

    @classmethod
    def get_prompt(cls, task: TaskSpec) -> str:
        """What an agent is told to do for ``task``; by default its ``prompt`` field."""
        prompt = getattr(task, "prompt", None)
        if isinstance(prompt, str):
            return prompt
        raise NotImplementedError(
            f"{cls.__name__} defines no get_prompt() and task {task.id!r} has no 'prompt' field"
        )


def server_method(env: Any, name: Literal["reset", "step"]) -> Callable[..., Any]:
    """The bound method a server calls for ``name`` on ``env``: ``env.reset`` or
    ``env.step``, or the one its class names instead (OpenEnv's ``reset_async`` /
    ``step_async`` where an OpenEnv environment overrides them; an instance may
    name its own, as ``openenv.core``'s ``create_app`` has it do)."""
    attribute = getattr(env, f"_server_{name}", name)
    method: Callable[..., Any] = getattr(env, attribute if isinstance(attribute, str) else name)
    return method
