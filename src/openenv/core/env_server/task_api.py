"""OpenEnv 0.10's task API, written as instance methods, on openenv's class-level one.

OpenEnv's ``TaskProvider`` methods (``list_splits(self)``, ``list_tasks(self,
split)``, ...) are instance methods, sync or async, that its server calls on a
environment freshly made by the app's factory, closed after; openenv's routes
(``/splits``, ``/tasks``, OpenReward's ``/{name}/splits``, ...) call
``list_splits`` and ``list_tasks`` on the class. ``TaskMethod`` is both: on an
instance, the method as written; on the class, the method called on a fresh
``cls()``, its answer mapped onto openenv's (split names; ``TaskSpec``-shaped
dicts). The server's routes call ``call_with(factory, ...)`` instead, so an
environment whose constructor takes arguments (``functools.partial(Env,
data_dir=...)``) lists the tasks of the data it was given.

>>> from openenv.core.env_server.interfaces import Environment
>>> class Quiz(Environment):
...     def list_splits(self):
...         return ["train", {"name": "test", "type": "test"}]
...     def list_tasks(self, split):
...         return [{"question": "1+1"}, {"id": "q2", "question": "2+2"}]
>>> Quiz.list_splits()
['train', 'test']
>>> Quiz.list_tasks("test")
[{'id': 'test-0', 'question': '1+1'}, {'id': 'q2', 'question': '2+2'}]
>>> Quiz().list_splits()  # as written, on an instance
['train', {'name': 'test', 'type': 'test'}]
>>> Quiz.__dict__["list_splits"].call_with(Quiz)  # on what a factory makes
['train', 'test']
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from pydantic import BaseModel

from openenv.core.env_server.session_thread import OnItsOwnThread

__all__ = ["TaskMethod", "TaskProvider", "wrap_task_methods"]


class TaskProvider(Protocol):
    """OpenEnv 0.10's optional task API, which an environment declares structurally."""

    def list_splits(self) -> list[Any]: ...

    def list_tasks(self, split: str) -> list[Any]: ...

    def num_tasks(self, split: str) -> int: ...

    def get_task(self, split: str, index: int) -> Any: ...

    def get_task_range(self, split: str, start: int, stop: int) -> list[Any]: ...


def _split_name(split: Any) -> str:
    # As OpenEnv's server reads them: a name, a {"name": ...} dict, or a model with a name.
    if isinstance(split, BaseModel):
        split = split.model_dump()
    if isinstance(split, dict):
        return str(split["name"])
    return str(split)


def _task(split: str, index: int, task: Any) -> dict[str, Any]:
    fields = task.model_dump(mode="json") if isinstance(task, BaseModel) else task
    if not isinstance(fields, dict):
        fields = {"task": fields}
    # openenv's TaskSpec needs an id unique in its split; OpenEnv's tasks need none.
    return {"id": str(fields.get("id", f"{split}-{index}")), **fields}


def _outcome(value: Any) -> Any:
    """``value``, or what it resolves to when it is awaitable."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    # Called from the server's event loop: the method's own loop runs in a thread.
    with ThreadPoolExecutor(1, thread_name_prefix="openenv-task-api") as pool:
        return pool.submit(asyncio.run, wait()).result()


class TaskMethod:
    """One of OpenEnv's task methods; see the module docstring."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is not None:
            return self.func.__get__(instance, owner)
        assert owner is not None
        return lambda *args: self.call_with(owner, *args)

    def call_with(self, factory: Callable[[], Any], *args: Any) -> Any:
        """The method called on an environment ``factory()`` makes (closed after),
        its answer mapped onto openenv's, as on the class."""
        # OpenEnv makes it, asks it and closes it on one thread: its own thread is not wanted.
        if isinstance(factory, OnItsOwnThread):  # a partial: its own args, not just .func
            factory = functools.partial(factory.func, *factory.args, **factory.keywords)
        env = factory()
        try:
            answer = _outcome(self.func(env, *args))
        finally:
            _outcome(env.close())
        if self.name == "list_splits":
            return [_split_name(split) for split in answer]
        if self.name == "list_tasks":
            return [_task(args[0], index, task) for index, task in enumerate(answer)]
        return answer


_METHODS = ("list_splits", "list_tasks", "num_tasks", "get_task", "get_task_range")


def wrap_task_methods(cls: type) -> None:
    """Make ``cls``'s task methods written as plain instance methods ``TaskMethod``s."""
    for name in _METHODS:
        method = cls.__dict__.get(name)
        if inspect.isfunction(method):
            task_method = TaskMethod(method)
            task_method.__set_name__(cls, name)
            setattr(cls, name, task_method)
