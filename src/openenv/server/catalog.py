"""What an environment offers, over HTTP: its tools, task splits and tasks.

Everything here is class-level: no environment instance is created and no
session slot is taken to answer; except for OpenEnv's task API, written as
instance methods, which is asked of an environment the app's factory makes
(closed after), as OpenEnv's server does. Splits and tasks are user code (a
``list_tasks`` may read a dataset): they are asked on a worker thread, never
on the event loop, so the sessions' steps go on meanwhile; at most
``THREADS_PER_ENV`` at once per environment, so one whose listing hangs holds
up only its own (not the other environments', nor whatever else runs on
anyio's shared worker threads). One that raises is answered with a 500
naming the call (its message as the server's ``error_details`` allows; the
traceback in the server log).
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from anyio import CapacityLimiter, to_thread
from fastapi import HTTPException, Query, Request
from fastapi.routing import APIRoute

from openenv.protocol import SplitList, TaskPage, ToolList
from openenv.server.redact import failure_text, log_failure
from openenv.server.service import EnvService
from openenv.tasks import TaskSpec, unknown_split_message
from openenv.tools import tools_of

__all__ = [
    "MAX_PAGE",
    "THREADS_PER_ENV",
    "catalog_routes",
    "in_thread",
    "splits_of",
    "tasks_of",
    "tool_names",
]

_T = TypeVar("_T")

MAX_PAGE = 1000  # tasks per page at most; a client pages through larger splits

THREADS_PER_ENV = 8  # task listings of one environment running at once; more wait

logger = logging.getLogger("openenv.server")
_limiters: weakref.WeakKeyDictionary[EnvService, CapacityLimiter] = weakref.WeakKeyDictionary()


async def in_thread(service: EnvService, func: Callable[..., _T], *args: Any) -> _T:
    """``func(*args)`` on a worker thread, within ``service``'s share of them.

    anyio's worker threads are shared (40 at once): a ``list_tasks`` that hung
    took one for each request asking it, until no environment could list its
    tasks any more."""
    limiter = _limiters.get(service)
    if limiter is None:
        limiter = _limiters[service] = CapacityLimiter(THREADS_PER_ENV)
    return await to_thread.run_sync(functools.partial(func, *args), limiter=limiter)


async def splits_of(service: EnvService) -> list[str]:
    """The environment's split names (none when its class is unknown)."""
    if service.env_cls is None:
        return []
    return list(await in_thread(service, _task_call, service, "list_splits"))


async def tasks_of(service: EnvService, split: str) -> Sequence[Any]:
    """The tasks of ``split``, one of ``splits_of(service)``."""
    if service.env_cls is None:
        return []
    tasks: Sequence[Any] = await in_thread(service, _task_call, service, "list_tasks", split)
    return tasks


def _task_call(service: EnvService, name: str, *args: Any) -> Any:
    try:
        return _call(service, name, *args)
    except Exception as exc:
        # Left to the server, it was a bare 500 that also dropped the connection.
        raise _failed(service, f"{name}{args!r}".replace(",)", ")"), exc) from exc


def _failed(service: EnvService, call: str, exc: Exception) -> HTTPException:
    log_failure(logger, call, exc)
    detail = f"the environment's {call} raised {failure_text(exc, service.settings.error_details)}"
    return HTTPException(status_code=500, detail=detail)


def _call(service: EnvService, name: str, *args: Any) -> Any:
    env_cls = service.env_cls
    assert env_cls is not None
    # OpenEnv's instance-method task API (openenv.core's TaskMethod) is asked of
    # what the app's factory makes: Env() may lack its constructor's arguments.
    call_with = getattr(inspect.getattr_static(env_cls, name, None), "call_with", None)
    if callable(call_with):
        return call_with(service.env_factory, *args)
    return getattr(env_cls, name)(*args)


def _page(service: EnvService, split: str, offset: int, limit: int) -> tuple[int, list[TaskSpec]]:
    # On a worker thread, the split's check and its listing in one hop: a split
    # may also be a Sequence that makes its items on demand.
    known = [] if service.env_cls is None else list(_task_call(service, "list_splits"))
    if split not in known:
        raise HTTPException(status_code=404, detail=unknown_split_message(split, known))
    every: Sequence[Any] = _task_call(service, "list_tasks", split)
    try:
        page = [TaskSpec.model_validate(task) for task in every[offset : offset + limit]]
    except Exception as exc:  # a task that is no TaskSpec, or a lazy split that raised
        raise _failed(service, f"list_tasks({split!r})[{offset}:{offset + limit}]", exc) from exc
    return len(every), page


def tool_names(service: EnvService) -> list[str]:
    return [] if service.env_cls is None else list(tools_of(service.env_cls))


def _service(request: Request) -> EnvService:
    service: EnvService = request.app.state.openenv
    return service


async def tools(request: Request) -> ToolList:
    """The environment's tools: names, descriptions, JSON Schemas of the arguments."""
    env_cls = _service(request).env_cls
    specs = {} if env_cls is None else tools_of(env_cls)
    return ToolList(tools=[spec.info for spec in specs.values()])


async def splits(request: Request) -> SplitList:
    """The names of the environment's task splits."""
    return SplitList(splits=await splits_of(_service(request)))


async def tasks(
    request: Request,
    split: Annotated[str, Query(description="One of the names GET /splits lists.")],
    offset: Annotated[int, Query(ge=0, description="Index of the first task to return.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Tasks per page.")] = 100,
) -> TaskPage:
    """One page of a split's tasks; follow ``next_offset`` for the next page."""
    service = _service(request)
    total, page = await in_thread(service, _page, service, split, offset, limit)
    end = offset + len(page)
    return TaskPage(
        split=split,
        offset=offset,
        limit=limit,
        total=total,
        tasks=page,
        next_offset=end if end < total else None,
    )


def catalog_routes() -> list[APIRoute]:
    return [
        APIRoute("/tools", tools, methods=["GET"], response_model=ToolList),
        APIRoute("/splits", splits, methods=["GET"], response_model=SplitList),
        APIRoute("/tasks", tasks, methods=["GET"], response_model=TaskPage),
    ]
