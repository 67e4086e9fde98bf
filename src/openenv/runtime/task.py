"""One episode to run (``Task``) and what came of it (``TaskResult``).

Both are plain frozen dataclasses, so they pickle (and cloudpickle) as they
are and travel to worker processes, Ray tasks and Spark partitions.

>>> async def agent(session):
...     await session.reset()
...     return (await session.step({"message": "hi"})).observation.echoed_message
>>> task = Task(id="t0", env="http://127.0.0.1:8000", agent=agent, seed=0)
>>> task.id, task.seed
('t0', 0)
"""

from __future__ import annotations

import enum
import traceback
import uuid
from collections.abc import Callable, ItemsView, Iterable, KeysView, Mapping, ValuesView
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex, overload

from openenv.client import ServerPool, ws_url
from openenv.environment import Environment
from openenv.protocol import reward_from, reward_value

if TYPE_CHECKING:
    from openenv.client import EnvClient

__all__ = ["EnvFactory", "Task", "TaskError", "TaskResult", "TaskResults", "TaskStatus"]

EnvFactory = Callable[[], Environment[Any, Any, Any]]


def _new_id() -> str:
    return f"task-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Task:
    """One episode: where the environment is, how to reset it, and who plays.

    AWorld's spelling works too: ``Task(input="what is 2+2?", agent=solve,
    id="q1")``, with no ``env`` for an agent that needs none.

    Args:
        id: Names the task in its result; unique within a run. Default: a
            random ``task-...`` id.
        env: A server URL (``http://host:port`` or ``ws://host:port/ws``), a
            ``ServerPool`` of several servers or a fleet (sessions go where
            there is room; URLs joined by commas work too), or
            a zero-argument factory (e.g. the environment class) to play the
            environment in the worker's own process, with no server at all.
        agent: An ``async def agent(session) -> Any``, or an object with
            ``act(observation) -> action`` (see ``openenv.runtime.Agent``).
        seed: Passed to ``reset`` (unless the agent passes its own).
        episode_id: Passed to ``reset`` likewise.
        reset_kwargs: Further keyword arguments for the environment's ``reset``.
        max_steps: The step budget of the ``act()`` loop; function agents read
            it as ``session.max_steps``. ``None``: until ``done``.
        timeout: Seconds the whole task may take, retries included; overrides
            ``RunConfig.timeout``.
        client_cls: An ``EnvClient`` subclass to parse a URL environment's
            replies into typed models (default: ``WebSocketEnvClient``).
        input: The episode's input, as AWorld's ``Task(input=...)``: the agent
            reads it as ``session.input``; a mapping is also passed to
            ``reset`` as keyword arguments (``reset_kwargs`` win on a clash; a
            ``seed`` or ``episode_id`` in either counts where ``seed`` and
            ``episode_id`` are not given).

    A task hashes by its ``id``, so it may key a dict or join a set:

    >>> task = Task(id="t0", env="http://127.0.0.1:8000", agent=print, reset_kwargs={"level": 2})
    >>> {task: "played"}[task]
    'played'
    """

    id: str = field(default_factory=_new_id)
    env: str | ServerPool | EnvFactory | None = None
    agent: Any = None
    seed: int | None = None
    episode_id: str | None = None
    reset_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_steps: int | None = None
    timeout: float | None = None
    client_cls: type[EnvClient[Any, Any, Any]] | None = None
    input: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Task id must be a non-empty string, got {self.id!r}")
        if self.env is None:
            pass  # the agent needs no environment (session.input is all it plays with)
        elif isinstance(self.env, str):
            for url in filter(None, map(str.strip, self.env.split(","))):
                ws_url(url)  # a malformed URL fails here, naming the accepted forms
        elif isinstance(self.env, ServerPool):
            pass
        elif isinstance(self.env, Environment):
            name = type(self.env).__name__
            raise TypeError(
                f"Task {self.id!r}: env must be a URL or a factory that makes a new "
                f"environment per episode, got an instance of {name}; pass {name} "
                f"(or functools.partial({name}, ...)) instead of {name}(...)"
            )
        elif not callable(self.env):
            raise TypeError(
                f"Task {self.id!r}: env must be a URL or an environment factory, "
                f"got {type(self.env).__name__}"
            )
        if self.agent is None:
            raise TypeError(f"Task {self.id!r} needs an agent: Task(..., agent=...)")
        if isinstance(self.agent, type):
            # Played as is, its act() was called unbound and every episode
            # failed with "act() missing 1 required positional argument".
            name = self.agent.__name__
            raise TypeError(
                f"Task {self.id!r}: agent is the class {name}; pass an instance: agent={name}()"
            )
        if not callable(getattr(self.agent, "act", None)) and not callable(self.agent):
            raise TypeError(
                f"Task {self.id!r}: agent must be an `async def agent(session)` or an "
                f"object with act(observation), got {type(self.agent).__name__}"
            )
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"Task {self.id!r}: max_steps must be >= 1, got {self.max_steps}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"Task {self.id!r}: timeout must be > 0, got {self.timeout}")

    def __hash__(self) -> int:
        # The dataclass's hash of every field fails on reset_kwargs (a dict) and
        # on any unhashable input or agent; equal tasks have equal ids.
        return hash(self.id)


class TaskStatus(enum.StrEnum):
    """How a task ended."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class TaskError:
    """Why a task failed: the exception's type and message, and where it was raised.

    >>> TaskError.from_exception(ValueError("bad move")).describe()
    'ValueError: bad move'
    """

    type: str
    message: str
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException) -> TaskError:
        text = "".join(traceback.format_exception(exc))
        return cls(type=type(exc).__name__, message=_message(exc), traceback=text)

    def describe(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


def _message(exc: BaseException) -> str:
    # An agent's exception is anything at all, its __str__ included: one that
    # raises must still leave its task a result.
    try:
        return str(exc)
    except Exception as failure:
        return f"<str() of the exception failed: {type(failure).__name__}>"


@dataclass(frozen=True)
class TaskResult:
    """What one task produced. Every run returns exactly one per task, in input order.

    Args:
        task_id: The task's ``id``.
        status: ``ok``, ``error`` (the agent or the environment raised, or the
            connection failed after every retry) or ``timeout``.
        value: What the agent returned (``None`` unless ``ok``).
        reward: The sum of its steps' rewards, in its last attempt: a retry
            plays the episode again from its reset, and what the lost attempt
            scored is discarded with its steps.
        steps: How many steps it took, in its last attempt.
        error: Why it failed, unless ``ok``.
        started_at: When it started, in seconds since the epoch.
        ended_at: When it ended, likewise.
        attempts: 1, plus one per retry after a connection-level failure.

    >>> result = TaskResult(task_id="t0", status=TaskStatus.OK, value=3, reward=1.5, steps=3)
    >>> result.ok, result.to_dict()["status"]
    (True, 'ok')
    """

    task_id: str
    status: TaskStatus
    value: Any = None
    reward: float = 0.0
    steps: int = 0
    error: TaskError | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.status is TaskStatus.OK

    @property
    def duration(self) -> float:
        """Seconds from start to end."""
        return self.ended_at - self.started_at

    # AWorld's names for the same facts (its TaskResponse), so that code written
    # for AWorld (``results[task.id].answer``, ``if resp.success``) reads them.

    @property
    def id(self) -> str:
        """``task_id``, as AWorld's ``TaskResponse.id``."""
        return self.task_id

    @property
    def answer(self) -> Any:
        """``value``, as AWorld's ``TaskResponse.answer``."""
        return self.value

    @property
    def success(self) -> bool:
        """``ok``, as AWorld's ``TaskResponse.success``."""
        return self.ok

    @property
    def msg(self) -> str | None:
        """Why the task failed (``None`` if ``ok``), as AWorld's ``TaskResponse.msg``."""
        return None if self.error is None else self.error.describe()

    @property
    def time_cost(self) -> float:
        """``duration``, as AWorld's ``TaskResponse.time_cost``."""
        return self.duration

    # AWorld's responses carry these too; results here do not keep them, and
    # saying where to find them beats a bare AttributeError.

    @property
    def trajectory(self) -> NoReturn:
        """Not kept here: ``RunConfig(record=folder)`` records every step instead."""
        raise AttributeError(
            "a TaskResult keeps no trajectory (AWorld's TaskResponse.trajectory): run with "
            "RunConfig(record=folder) and read the steps with openenv.trajectories.load(folder)"
        )

    @property
    def usage(self) -> NoReturn:
        """Not kept here: no model calls are counted (AWorld's token ``usage``)."""
        raise AttributeError(
            "a TaskResult counts no model token usage (AWorld's TaskResponse.usage): "
            "an agent that calls a model can return its usage with its answer"
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskResult:
        """A result back from ``to_dict`` (a line of ``openenv run --out``).

        >>> result = TaskResult(task_id="t0", status=TaskStatus.TIMEOUT, attempts=2,
        ...                     error=TaskError("TimeoutError", "too slow"))
        >>> TaskResult.from_dict(result.to_dict()) == result
        True
        """
        error = data.get("error")
        return cls(
            task_id=data["task_id"],
            status=TaskStatus(data["status"]),
            value=data.get("value"),
            reward=reward_from(data.get("reward", 0.0)),
            steps=data.get("steps", 0),
            error=TaskError(error["type"], error["message"]) if error else None,
            started_at=data.get("started_at", 0.0),
            ended_at=data.get("ended_at", 0.0),
            attempts=data.get("attempts", 1),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (a pydantic ``value`` is dumped; other values are kept as they are)."""
        value = self.value
        dump = getattr(value, "model_dump", None)
        if callable(dump):
            value = dump(mode="json")
        error = None
        if self.error is not None:
            error = {"type": self.error.type, "message": self.error.message}
        return {
            "task_id": self.task_id,
            "status": self.status.value,
            "value": value,
            "reward": reward_value(self.reward),  # a NaN total stays NaN, not null
            "steps": self.steps,
            "error": error,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "attempts": self.attempts,
        }


class TaskResults(list[TaskResult]):
    """A run's results: a list, one per task in input order, that is also keyed by task id.

    AWorld's ``Runners.run_task`` returns a dict of task id to response, and
    its users write ``results[task.id].answer``, ``results.get(task.id)``,
    ``task.id in results`` and ``results.items()``. Those work here too; as a
    list, iterating gives the results themselves and ``results[0]`` is the first.

    >>> results = TaskResults([TaskResult(task_id="q1", status=TaskStatus.OK, value="4")])
    >>> results["q1"].answer, results[0].answer, "q1" in results, results.get("q2")
    ('4', '4', True, None)
    """

    def __init__(self, results: Iterable[TaskResult] = ()) -> None:
        super().__init__(results)
        self._positions: dict[str, int] = {}

    def _position(self, task_id: str) -> int | None:
        # Checked on every hit, rebuilt on a miss: the list may have been
        # sorted or changed since, and a stale position must never answer.
        position = self._positions.get(task_id)
        if position is not None and position < len(self) and self._id_at(position) == task_id:
            return position
        self._positions = {}
        for index, result in enumerate(self):
            self._positions.setdefault(result.task_id, index)
        return self._positions.get(task_id)

    def _id_at(self, position: int) -> str:
        return super().__getitem__(position).task_id

    @overload
    def __getitem__(self, key: SupportsIndex) -> TaskResult: ...
    @overload
    def __getitem__(self, key: slice) -> list[TaskResult]: ...
    @overload
    def __getitem__(self, key: str) -> TaskResult: ...
    def __getitem__(self, key: SupportsIndex | slice | str) -> TaskResult | list[TaskResult]:
        if isinstance(key, str):
            position = self._position(key)
            if position is None:
                raise KeyError(key)
            return super().__getitem__(position)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return self._position(key) is not None
        return super().__contains__(key)

    def get(self, task_id: str, default: Any = None) -> Any:
        """The result of task ``task_id``, or ``default`` if there is none."""
        position = self._position(task_id)
        return default if position is None else super().__getitem__(position)

    def by_id(self) -> dict[str, TaskResult]:
        """A dict of task id to result, in input order."""
        found: dict[str, TaskResult] = {}
        for result in self:
            found.setdefault(result.task_id, result)
        return found

    def keys(self) -> KeysView[str]:
        """The task ids, as the keys of AWorld's dict of results."""
        return self.by_id().keys()

    def values(self) -> ValuesView[TaskResult]:
        """The results, as the values of AWorld's dict of results."""
        return self.by_id().values()

    def items(self) -> ItemsView[str, TaskResult]:
        """``(task id, result)`` pairs, as AWorld's dict of results gives them."""
        return self.by_id().items()
