"""OpenEnv's stateless HTTP routes: ``POST /reset``, ``POST /step``, ``GET /state``.

OpenEnv 0.10 serves these (its "simulation" mode) for a look with ``curl`` or
a browser: each request gets a fresh environment, makes its one call and
closes it, so nothing carries from one request to the next. Episodes are
played over ``/ws``. Here such a request is a session like any other: it
takes a slot (a full server answers 503 with ``Retry-After``), makes its
environment with the factory and runs the call with the session's deadlines
and errors, then closes it. Replies have OpenEnv's shape:
``{"observation": {...}, "reward": r, "done": d, "metadata": m}`` for reset
and step (the observation's ``metadata`` in it too), the
state's fields for ``/state``; an action that does not fit the schema is 422
with pydantic's errors as ``detail``, as OpenEnv answers it.

``GET /metadata`` of an OpenEnv environment that overrides ``get_metadata``
is that method's answer, as on OpenEnv's server, which asks a fresh
environment each time; here one is asked once (in a slot, then closed) and
its answer kept.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from typing import Any, Literal

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute

from openenv import protocol
from openenv.protocol import ErrorCode
from openenv.server import calls
from openenv.server.http_bodies import client_gone, route_body
from openenv.server.leaving import ClientLeft
from openenv.server.service import EnvService, SessionRefused
from openenv.server.sessions import Session
from openenv.types import EnvironmentMetadata

__all__ = ["environment_metadata", "simulation_routes"]

# What an error reply becomes: the action's fields are the caller's to fix (422),
# a full or stopping server is for later (503), the rest is the server's (500).
_STATUS = {
    ErrorCode.VALIDATION_ERROR: 422,
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.CAPACITY_REACHED: 503,
}


def _service(request: Request) -> EnvService:
    service: EnvService = request.app.state.openenv
    return service


async def _body(request: Request, service: EnvService) -> dict[str, Any]:
    raw = await route_body(request, service.settings.max_message_size)
    try:
        value = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        raise HTTPException(400, "the request body is not JSON") from None
    if not isinstance(value, dict):
        raise HTTPException(422, "the request body must be a JSON object")
    return value


async def _open(service: EnvService, left: ClientLeft | None = None) -> Session:
    """A session for one call: a full or stopping server is a 503 to retry, a
    factory that failed a 500."""
    try:
        return await service.open_session(left)
    except SessionRefused as refused:
        status = 503 if refused.code is not ErrorCode.FACTORY_ERROR else 500
        headers = {"Retry-After": "1"} if status == 503 else None
        raise HTTPException(status, refused.message, headers=headers) from None


async def _once(
    request: Request, kind: Literal["reset", "step", "state"], data: dict[str, Any] | None
) -> protocol.ServerMessage:
    """One call on a fresh environment of its own, closed after it, its slot freed.

    The request's body has been read: a caller that leaves while it waits for a
    slot (``queue_timeout``) is dropped from the line with no environment made."""
    service = _service(request)
    async with client_gone(request.receive) as left:
        session = await _open(service, left)
    try:
        reply = await session.handle(protocol.request_frame(kind, data))
    finally:
        if session.stuck is None:
            await session.aclose("http_call_done")
        else:
            # A blocking call past its deadline: the reply goes now, and close()
            # (and the slot) wait for its thread, as on /ws.
            _close_later(session, "http_call_done")
    assert reply is not None, "only a close request has no reply"
    message = protocol.parse_server_message(reply)
    if isinstance(message, protocol.ErrorReply):
        error = message.data
        details = error.model_extra or {}
        status = _STATUS.get(error.code, 500)
        detail: Any = details.get("errors", error.message) if status == 422 else error.message
        raise HTTPException(status, detail)
    return message


# What each service's OpenEnv environment said of itself, once asked.
_asked: weakref.WeakKeyDictionary[EnvService, EnvironmentMetadata] = weakref.WeakKeyDictionary()


async def environment_metadata(service: EnvService) -> EnvironmentMetadata:
    """``service.metadata``, or, for an OpenEnv environment that overrides
    ``get_metadata``, what that says (asked of one environment, then kept)."""
    if not getattr(service.env_cls, "_server_metadata", False):
        return service.metadata
    if (kept := _asked.get(service)) is not None:
        return kept
    session = await _open(service)
    try:
        submit = functools.partial(service.handoff.submit, session.ticket)
        deadline = service.settings.reset_timeout
        ask = session.env.get_metadata  # type: ignore[attr-defined]  # OpenEnv's, checked above
        answer = await calls.call(ask, submit=submit, timeout=deadline)
        fields = answer.model_dump() if hasattr(answer, "model_dump") else dict(answer)
        said = EnvironmentMetadata.model_validate(fields).model_dump(exclude_unset=True)
    except calls.DeadlineExceeded as exc:
        if exc.stuck is not None:
            # A thread cannot be stopped: close() waits for it, as after a step past
            # its deadline, and the slot stays taken until then; the reply does not.
            session.stuck = exc.stuck
            _close_later(session, "metadata_timeout")
        raise HTTPException(500, f"get_metadata() {exc}") from None
    except BaseException as exc:  # its text may hold secrets: the type only, as for a step
        if isinstance(exc, asyncio.CancelledError) and calls.being_cancelled():
            raise
        # A SystemExit too: let out, it would be a plain-text 500 and a traceback.
        raise HTTPException(500, f"get_metadata() raised {type(exc).__name__}") from None
    finally:
        if session.stuck is None:
            await session.aclose("metadata_asked")
    kept = _asked[service] = service.metadata.model_copy(update=said)
    return kept


# Closes waiting for a call past its deadline, kept from the garbage collector.
_closing: set[asyncio.Task[None]] = set()


def _close_later(session: Session, reason: str) -> None:
    task = asyncio.get_running_loop().create_task(session.aclose(reason))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def _observation(message: protocol.ServerMessage) -> Response:
    assert isinstance(message, protocol.ObservationReply)
    data = message.data
    # OpenEnv's shape: the metadata inside the observation, and beside it when any.
    body = {
        "observation": {"metadata": data.metadata, **data.observation},
        "reward": protocol.reward_value(data.reward),  # a NaN as "NaN", as on /ws
        "done": data.done,
        "metadata": data.metadata or None,
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def reset(request: Request) -> Response:
    """Reset a fresh environment (``seed``, ``episode_id``, reset arguments) and
    return its first observation; the environment is closed after."""
    body = await _body(request, _service(request))
    return _observation(await _once(request, "reset", body))


async def step(request: Request) -> Response:
    """Step a fresh environment (never reset) with ``{"action": {...}}``, as OpenEnv does."""
    body = await _body(request, _service(request))
    action = body.get("action")
    if not isinstance(action, dict):
        raise HTTPException(422, "the request body needs an 'action' object")
    return _observation(await _once(request, "step", action))


async def state(request: Request) -> Response:
    """The state of a fresh environment."""
    message = await _once(request, "state", None)
    assert isinstance(message, protocol.StateReply)
    return Response(orjson.dumps(message.data), media_type="application/json")


def simulation_routes() -> list[BaseRoute]:
    return [
        APIRoute("/reset", reset, methods=["POST"], response_class=Response),
        APIRoute("/step", step, methods=["POST"], response_class=Response),
        APIRoute("/state", state, methods=["GET"], response_class=Response),
    ]
