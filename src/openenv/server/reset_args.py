"""What a session's ``reset`` is called with: the client's arguments checked
against the environment's ``reset`` signature, and its task parsed as the
class that signature declares.

An environment in a child process (``isolation="process"``) is reached
through a proxy whose ``reset`` takes anything; its child reports what the
real one takes, so a session checks the same arguments either way.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from openenv import protocol
from openenv.environment import server_method
from openenv.protocol import ErrorCode, FrameError
from openenv.tasks import TaskSpec, task_class

__all__ = ["ResetArgs"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")

    seed: int | None = None
    episode_id: str | None = None


@dataclass(frozen=True, slots=True)
class ResetArgs:
    """What one environment's ``reset`` takes.

    >>> from openenv import TaskSpec
    >>> class Goal(TaskSpec):
    ...     target: int = 7
    >>> class Game:
    ...     def reset(self, seed: int | None = None, task: Goal | None = None): ...
    >>> args = ResetArgs.of(Game())
    >>> kwargs = args.kwargs({"seed": 1, "task": {"id": "a"}}, None)
    >>> kwargs["seed"], type(kwargs["task"]).__name__, kwargs["task"].target
    (1, 'Goal', 7)
    >>> args.kwargs({"level": 3}, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    openenv.protocol_errors.FrameError: reset() of Game does not accept 'level'; it accepts ...
    """

    accepts: frozenset[str] | None  # None: it takes **kwargs
    task_cls: type[TaskSpec]
    drops_unknown: bool  # OpenEnv's environments ignore what reset does not take
    env_name: str

    @classmethod
    def of(cls, env: Any) -> ResetArgs:
        reported: ResetArgs | None = getattr(env, "child_reset_args", None)
        if isinstance(reported, ResetArgs):  # a proxy for an environment in a child process
            return reported
        accepts, task_cls = _facts(server_method(env, "reset"))
        drops = bool(getattr(type(env), "_drops_unknown_reset_kwargs", False))
        return cls(accepts, task_cls, drops, type(env).__name__)

    def kwargs(self, data: Any, request_id: protocol.RequestId | None) -> dict[str, Any]:
        """The keyword arguments for ``reset``; ``FrameError`` if they are not its."""
        try:
            wire = _Wire.model_validate(data)
        except ValidationError as exc:
            raise protocol.validation_frame_error(exc, "reset arguments", request_id) from None
        kwargs = wire.model_dump(exclude_unset=True)
        if self.accepts is not None and not self.accepts.issuperset(kwargs):
            if self.drops_unknown:
                kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
            else:
                raise self._unknown(kwargs, request_id)
        if kwargs.get("task") is not None:
            kwargs["task"] = self.task(kwargs["task"], request_id)
        return kwargs

    def task(self, data: Any, request_id: protocol.RequestId | None) -> TaskSpec:
        """``data`` as the task class ``reset`` declares; ``FrameError`` if it is not one."""
        try:
            return self.task_cls.model_validate(data)
        except ValidationError as exc:
            raise protocol.validation_frame_error(exc, "task", request_id) from None

    def _unknown(
        self, kwargs: Mapping[str, Any], request_id: protocol.RequestId | None
    ) -> FrameError:
        assert self.accepts is not None
        unknown = sorted(set(kwargs) - self.accepts)
        return FrameError(
            ErrorCode.VALIDATION_ERROR,
            f"reset() of {self.env_name} does not accept "
            f"{', '.join(map(repr, unknown))}; it accepts {', '.join(sorted(self.accepts))}",
            request_id=request_id,
            details={
                "errors": [
                    {"loc": ["data", k], "msg": "unexpected argument", "type": "extra"}
                    for k in unknown
                ]
            },
        )


_Facts = tuple[frozenset[str] | None, type[TaskSpec]]

# Every session of a class asks about the same function: inspect it once.
_CACHE: weakref.WeakKeyDictionary[Any, _Facts] = weakref.WeakKeyDictionary()


def _facts(fn: Callable[..., Any]) -> _Facts:
    key = getattr(fn, "__func__", None)
    if key is None:
        return _inspect_kwargs(fn), task_class(fn)
    try:
        return _CACHE[key]
    except KeyError:
        facts = _CACHE[key] = (_inspect_kwargs(fn), task_class(fn))
        return facts


def _inspect_kwargs(fn: Callable[..., Any]) -> frozenset[str] | None:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )
