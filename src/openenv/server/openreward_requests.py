"""Reading OpenReward's requests: the session header, bounded JSON bodies, tasks by split.

Each refusal is an ``HTTPException`` that the routes of ``openreward.py`` let through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from openenv.server import openreward_wire as wire
from openenv.server.catalog import in_thread, splits_of, tasks_of
from openenv.server.http_bodies import route_body
from openenv.server.service import EnvService
from openenv.tasks import unknown_split_message

__all__ = ["body", "fail", "json_response", "session_id", "split_names", "split_tasks", "task_at"]

_B = TypeVar("_B", bound=BaseModel)


def fail(status: int, message: str) -> NoReturn:
    raise HTTPException(status, message)


def json_response(value: Any) -> Response:
    return JSONResponse(value)


def session_id(request: Request) -> str:
    sid = request.headers.get(wire.SESSION_HEADER, "").strip()
    if not sid:
        fail(400, "X-Session-ID header is required")
    return sid


async def body(request: Request, model: type[_B], service: EnvService) -> _B:
    """The JSON body as ``model``: 413 past ``max_message_size``, 422 when it does not fit."""
    raw = await route_body(request, service.settings.max_message_size)
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        fail(422, f"invalid {model.__name__} body: {problems}")


async def split_names(service: EnvService) -> list[str]:
    return await splits_of(service)


async def split_tasks(service: EnvService, split: str) -> Sequence[Any]:
    known = await split_names(service)
    if split not in known or service.env_cls is None:
        fail(400, f"Invalid split: {unknown_split_message(split, known)}")
    return await tasks_of(service, split)


async def task_at(service: EnvService, split: str, index: int) -> Any:
    tasks = await split_tasks(service, split)
    # On a worker thread too: a split may be a Sequence that makes its items on demand.
    return await in_thread(service, _task_json_at, tasks, split, index)


def _task_json_at(tasks: Sequence[Any], split: str, index: int) -> Any:
    if not -len(tasks) <= index < len(tasks):
        fail(400, f"Invalid index: split {split!r} has {len(tasks)} tasks, no index {index}")
    return wire.task_json(tasks[index])
