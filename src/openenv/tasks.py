"""Tasks: the named problems an environment offers, grouped in splits.

An environment lists its splits (``list_splits()``) and the tasks of each
(``list_tasks(split)``) at class level, so they can be browsed without
creating an instance. A task travels to ``reset(task=...)`` and is typed by
the annotation of that parameter.
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TaskSpec", "task_class", "unknown_split_message"]


class TaskSpec(BaseModel):
    """One task of a split: an ``id`` plus whatever the environment needs.

    Environments subclass it with typed fields; a client that does not know
    the subclass keeps every field anyway (``extra="allow"``).

    >>> class CountTo(TaskSpec):
    ...     target: int
    >>> task = CountTo(id="train-3", target=7)
    >>> task.model_dump()
    {'id': 'train-3', 'target': 7}
    >>> TaskSpec.model_validate(task.model_dump()).target  # untyped, fields kept
    7
    """

    model_config = ConfigDict(extra="allow")

    id: str = Field(description="Identifier of the task, unique within its split.")


def task_class(reset: Callable[..., Any]) -> type[TaskSpec]:
    """The ``TaskSpec`` subclass a ``reset`` method annotates its ``task`` with.

    >>> class CountTo(TaskSpec):
    ...     target: int
    >>> def reset(seed=None, task: CountTo | None = None): ...
    >>> task_class(reset).__name__
    'CountTo'
    >>> task_class(lambda seed=None, **kwargs: None).__name__
    'TaskSpec'
    """
    if "task" not in inspect.signature(reset).parameters:
        return TaskSpec
    try:
        hint = typing.get_type_hints(reset).get("task")
    except Exception:  # unresolvable annotations: fall back to the untyped task
        return TaskSpec
    candidates = typing.get_args(hint) if _is_union(hint) else (hint,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, TaskSpec):
            return candidate
    return TaskSpec


def _is_union(hint: object) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def unknown_split_message(split: str, known: Sequence[str]) -> str:
    """Say that ``split`` does not exist, list the real ones, suggest the closest.

    >>> unknown_split_message("trian", ["train", "test"])
    "unknown split 'trian'; this environment has: train, test; did you mean 'train'?"
    >>> unknown_split_message("train", [])
    "unknown split 'train'; this environment has no task splits"
    """
    if not known:
        return f"unknown split {split!r}; this environment has no task splits"
    hint = difflib.get_close_matches(split, list(known), n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    return f"unknown split {split!r}; this environment has: {', '.join(known)}{suggestion}"
