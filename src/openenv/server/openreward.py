"""OpenReward's HTTP session protocol beside ``/ws``, so its SDK drives openenv servers.

The ``openreward`` SDK opens a session id with ``POST /create_session`` (an
event stream), makes the environment with ``POST /create`` (the task by
split and index, or by spec), then calls ``GET /task_tools``, ``GET /prompt``
and ``POST /call`` (the result streamed back) with the id in
``X-Session-ID`` and the key in ``X-API-Key``, pings every 10 s and ends with
``POST /delete``. Catalogue reads (``/splits``, ``/tasks``, ``/num_tasks``,
``/task``, ``/task_range``, ``/tools``) name no session. Each path comes bare
(``/call``) or under an environment's name (``/counter/call``).

A session here is an openenv ``Session``: its slot comes from the same
registry as ``/ws`` sessions (one cap), its tool calls go through
``Session.handle`` as a WebSocket ``call_tool`` frame would, and it ends on
``/delete``, on idling past ``session_timeout`` (HTTP has no connection to
watch; the SDK's pings keep a live one fresh), on a fatal error and on
shutdown. A bare path means the only environment, else the one ``X-Deployment`` names.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Receive, Scope, Send

import openenv
from openenv import protocol
from openenv.protocol import ErrorCode
from openenv.server import openreward_requests as req
from openenv.server import openreward_wire as wire
from openenv.server.http_bodies import client_gone
from openenv.server.security import AccessGuard
from openenv.server.service import EnvService, SessionRefused
from openenv.server.session_host import SessionState
from openenv.server.session_ids import EndedSessions, SessionIds
from openenv.server.sessions import Session
from openenv.tools import tools_of

__all__ = ["OpenRewardBridge"]

logger = logging.getLogger("openenv.server")


# Idle seconds before a session is closed when the app sets no session_timeout
# (OpenReward's own server reaps after 900 s without a ping).
DEFAULT_IDLE_TIMEOUT = 900.0
_CALLS_KEPT = 4  # finished calls a session keeps for the SDK to resume a broken stream
# Calls of one session running or waiting their turn: they outlive their requests.
MAX_QUEUED_CALLS = 32
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# /create resets once, with the session's task: the next episode is the next session's.
_PLAY_AGAIN = (
    "an OpenReward session plays one episode: open a new session (the SDK's "
    "environment.session(); POST /create_session, then /create) to play another, "
    "and end this one (POST /delete) to free its slot"
)


@dataclass
class _Entry:
    sid: str
    env: str
    service: EnvService
    session: Session
    ended: str | None = None  # why, once the session is ending: calls still queued refuse
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_active: float = field(default_factory=time.monotonic)
    calls: OrderedDict[str, asyncio.Task[tuple[str, bytes]]] = field(default_factory=OrderedDict)
    running: set[asyncio.Task[tuple[str, bytes]]] = field(default_factory=set)  # not yet done
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)


@dataclass
class _Claim:
    """An id whose ``/create`` is under way, and whether a ``/delete`` came meanwhile."""

    env: str | None = None  # once the body names it, for the delete's key check
    deleted: bool = False
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # deleted, or its client left


class _SessionOnly(Route):
    """A route only for requests that carry an OpenReward session id.

    ``GET /tools`` and ``GET /splits`` are openenv's catalogue too: the SDK's
    requests (which always carry ``X-Session-ID``) get OpenReward's shapes.
    """

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE and not any(
            name == b"x-session-id" for name, _ in scope.get("headers", ())
        ):
            return Match.NONE, {}
        return match, child


class OpenRewardBridge:
    """Serve OpenReward's session protocol for ``services`` (environment name -> service)."""

    def __init__(self, services: Mapping[str, EnvService]) -> None:
        self.services = dict(services)
        self._by_lower = {name.lower(): name for name in self.services}

        async def nothing(scope: Scope, receive: Receive, send: Send) -> None: ...

        self.guards = {
            name: AccessGuard(
                nothing,
                api_key=s.settings.api_key,
                allowed_origins=s.settings.allowed_origins,
                allowed_hosts=s.settings.allowed_hosts,
            )
            for name, s in self.services.items()
        }
        self.sessions: dict[str, _Entry] = {}
        self.creating: dict[str, _Claim] = {}  # ids whose /create is under way
        self.ended = EndedSessions()  # to answer 410 rather than 404
        self.ids = SessionIds()
        for name, service in self.services.items():
            service.lifespan_hooks.append(functools.partial(self._running, name))
            service.drain_hooks.append(functools.partial(self._drain, name))

    # -- routes ------------------------------------------------------------------

    def routes(self) -> tuple[list[BaseRoute], list[BaseRoute]]:
        """Routes to put before an app's own (root paths) and after them (``/{env}/...``)."""
        env_ops: list[tuple[str, Callable[..., Awaitable[Response]], str]] = [
            ("tools", self.tools, "GET"),
            ("splits", self.splits, "GET"),
            ("tasks", self.tasks, "POST"),
            ("num_tasks", self.num_tasks, "POST"),
            ("task", self.task, "POST"),
            ("task_range", self.task_range, "POST"),
            ("task_tools", self.task_tools, "GET"),
            ("prompt", self.prompt, "GET"),
            ("call", self.call, "POST"),
        ]
        root: list[BaseRoute] = [
            Route("/create_session", self.create_session, methods=["POST"]),
            Route("/delete_session", self.delete, methods=["POST"]),
            Route("/create", self.create, methods=["POST"]),
            Route("/delete", self.delete, methods=["POST"]),
            Route("/ping", self.ping, methods=["POST"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/list_environments", self.list_environments, methods=["GET"]),
        ]
        for op, handler, method in env_ops:
            kind = _SessionOnly if op in ("tools", "splits") else Route
            root.append(kind(f"/{op}", handler, methods=[method]))
        prefixed: list[BaseRoute] = [
            Route(f"/{{env:path}}/{op}", handler, methods=[method])
            for op, handler, method in env_ops
        ]
        return root, prefixed

    # -- which environment, and may this client use it ---------------------------

    def _resolve(self, request: Request, name: str) -> str:
        found = name if name in self.services else self._by_lower.get(name.lower())
        if found is None:
            known = ", ".join(self._opened_by(request)) or "no environment this request may use"
            req.fail(404, f"unknown environment {name!r}; this server has: {known}")
        return found

    def _opened_by(self, request: Request) -> list[str]:
        """The environments whose key (and hosts, origins) the request meets, as
        ``GET /envs`` lists them: another key's environments are not named to it."""
        path = request.url.path
        return [
            env for env, guard in self.guards.items() if guard.refusal(request.scope, path) is None
        ]

    def _env_of(self, request: Request, name: str | None = None) -> str:
        name = name if name is not None else request.path_params.get("env")
        if name is not None:
            return self._resolve(request, name)
        if len(self.services) == 1:
            return next(iter(self.services))
        deployment = request.headers.get(wire.DEPLOYMENT_HEADER, "").strip()
        if not deployment:
            req.fail(
                404,
                f"which environment? name it in the path (/{{env}}/...) or in X-Deployment; "
                f"this server has: {', '.join(self._opened_by(request))}",
            )
        if deployment in self.services or deployment.lower() in self._by_lower:
            return self._resolve(request, deployment)
        return self._resolve(request, deployment.rpartition("/")[2])  # "ns/counter" for counter

    def _check(self, request: Request, env: str | None, path: str) -> None:
        """The environment's API key, allowed hosts and (for ``path``) origins.

        With no environment named yet (``/create_session``), a key that any of
        the server's environments accepts will do: a session id costs nothing.
        """
        guards = [self.guards[env]] if env is not None else list(self.guards.values())
        refusals = [guard.refusal(request.scope, path) for guard in guards]
        if all(refusals):
            status, message = refusals[0]  # type: ignore[misc]
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            raise HTTPException(status, message, headers=headers)

    def _service(self, request: Request, path: str) -> tuple[str, EnvService]:
        env = self._env_of(request)
        self._check(request, env, path)
        return env, self.services[env]

    # -- catalogue: no session needed --------------------------------------------

    async def tools(self, request: Request) -> Response:
        _, service = self._service(request, "/tools")
        specs = tools_of(service.env_cls) if service.env_cls is not None else {}
        return req.json_response(wire.tool_list([spec.info for spec in specs.values()]))

    async def splits(self, request: Request) -> Response:
        _, service = self._service(request, "/splits")
        return req.json_response(
            [wire.split_entry(name) for name in await req.split_names(service)]
        )

    async def tasks(self, request: Request) -> Response:
        env, service = self._service(request, "/tasks")
        body = await req.body(request, wire.SplitRequest, service)
        tasks = await req.split_tasks(service, body.split)
        return req.json_response({"tasks": [wire.task_json(t) for t in tasks], "env_name": env})

    async def num_tasks(self, request: Request) -> Response:
        _, service = self._service(request, "/num_tasks")
        body = await req.body(request, wire.SplitRequest, service)
        return req.json_response({"num_tasks": len(await req.split_tasks(service, body.split))})

    async def task(self, request: Request) -> Response:
        env, service = self._service(request, "/task")
        body = await req.body(request, wire.TaskRequest, service)
        return req.json_response(
            {"task": await req.task_at(service, body.split, body.index), "env_name": env}
        )

    async def task_range(self, request: Request) -> Response:
        env, service = self._service(request, "/task_range")
        body = await req.body(request, wire.TaskRangeRequest, service)
        tasks = await req.split_tasks(service, body.split)
        chosen = [wire.task_json(tasks[i]) for i in range(len(tasks))[body.start : body.stop]]
        return req.json_response({"tasks": chosen, "env_name": env})

    async def version(self, request: Request) -> Response:
        self._check(request, None, "/version")
        return req.json_response({"version": openenv.__version__, "build_sha": None})

    async def list_environments(self, request: Request) -> Response:
        self._check(request, None, "/list_environments")
        return req.json_response(self._opened_by(request))

    # -- sessions ----------------------------------------------------------------

    async def create_session(self, request: Request) -> Response:
        """A new session id, as OpenReward's event stream: ``task_id`` then an empty ``end``."""
        self._check(request, None, "/create_session")
        sid = self.ids.new()
        body = wire.sse("task_id", sid) + wire.sse("end", "")
        return Response(body, media_type="text/event-stream", headers=_STREAM_HEADERS)

    async def create(self, request: Request) -> Response:
        """Open the session's environment (a slot, the factory, ``reset(task=...)``)."""
        sid = req.session_id(request)
        if not self.ids.issued(sid):
            req.fail(404, f"unknown session id {sid[:64]!r}: open one with POST /create_session")
        if sid in self.sessions or sid in self.creating:
            req.fail(400, "Session already exists")
        self._check(request, None, "/create")  # before reading the body
        # Claimed before any slot or factory: a second /create at once takes neither.
        claim = self.creating[sid] = _Claim()
        try:
            return await self._create(request, sid, claim)
        finally:
            del self.creating[sid]

    async def _create(self, request: Request, sid: str, claim: _Claim) -> Response:
        body = await req.body(request, wire.CreateRequest, next(iter(self.services.values())))
        env = claim.env = self._env_of(request, body.env_name)
        self._check(request, env, "/create")
        service = self.services[env]
        if body.toolset_name is not None:
            req.fail(400, f"unknown toolset {body.toolset_name!r}: openenv serves no toolsets")
        if body.task_spec is not None:
            task: Any = body.task_spec
        else:
            task = await req.task_at(service, body.split or "", body.index or 0)  # both set
        try:
            # A /delete meanwhile takes it out of the line as a client leaving does.
            async with client_gone(request.receive, claim.stop) as left:
                session = await service.open_session(left)
        except SessionRefused as refused:
            if claim.deleted:  # as if made and then deleted, with nothing made
                self.ended.add(sid, "client_close")
                return req.json_response({"sid": sid})
            status = 500 if refused.code is ErrorCode.FACTORY_ERROR else 503
            headers = {"Retry-After": "1"} if status == 503 else None
            raise HTTPException(status, refused.message, headers=headers) from None
        session.play_again = _PLAY_AGAIN
        entry = _Entry(sid, env, service, session)
        try:
            if not claim.deleted:  # no reset for a session that is to close at once
                reply = await self._handle(entry, protocol.request_frame("reset", {"task": task}))
                if isinstance(reply, protocol.ErrorReply):
                    status = 400 if reply.data.code is ErrorCode.VALIDATION_ERROR else 500
                    req.fail(status, f"could not reset the environment: {reply.data.message}")
        except BaseException:
            await session.aclose("openreward_create_failed")
            raise
        self.sessions[sid] = entry
        self.ended.forget(sid)
        if claim.deleted:  # deleted while it was made: the delete is carried out now
            await self._end(sid, "client_close")
        elif await request.is_disconnected():  # nobody will use or delete it
            await self._end(sid, "client_gone")
        return req.json_response({"sid": sid})

    async def delete(self, request: Request) -> Response:
        """End the session and free its slot; an id with no session is a no-op. One
        still being made is ended by its ``/create`` once made, answered now."""
        sid = req.session_id(request)
        entry = self.sessions.get(sid)
        claim = self.creating.get(sid) if entry is None else None
        env = entry.env if entry is not None else claim.env if claim is not None else None
        self._check(request, env, "/delete")
        if entry is not None:
            await self._end(sid, "client_close")
        elif claim is not None:
            claim.deleted = True
            claim.stop.set()
        return req.json_response({"sid": sid})

    async def ping(self, request: Request) -> Response:
        self._entry(request, "/ping")
        return req.json_response({"status": "ok"})

    def _entry(self, request: Request, path: str) -> _Entry:
        """The live session the request names (404 unknown, 410 ended), kept fresh."""
        sid = req.session_id(request)
        entry = self.sessions.get(sid)
        if entry is None:
            if (why := self.ended.get(sid)) is not None:
                self._check(request, None, path)
                req.fail(410, f"session {sid[:64]} has ended ({why}); open a new one")
            self._check(request, None, path)
            req.fail(404, f"unknown session id {sid[:64]!r}: open one with POST /create")
        self._check(request, entry.env, path)
        if "env" in request.path_params and self._env_of(request) != entry.env:
            req.fail(404, f"session {sid[:64]} is a session of environment {entry.env!r}")
        entry.last_active = time.monotonic()
        return entry

    async def task_tools(self, request: Request) -> Response:
        entry = self._entry(request, "/task_tools")
        return req.json_response(
            wire.tool_list([spec.info for spec in entry.session.tools.values()])
        )

    async def prompt(self, request: Request) -> Response:
        entry = self._entry(request, "/prompt")
        async with entry.lock:
            if entry.ended is not None:
                req.fail(410, f"session {entry.sid[:64]} has ended ({entry.ended}); open a new one")
            reply = await self._handle(entry, protocol.request_frame("get_prompt"))
        await self._after_call(entry)
        if isinstance(reply, protocol.ErrorReply):
            status = 400 if reply.data.code is ErrorCode.VALIDATION_ERROR else 500
            req.fail(status, f"[{reply.data.code.value}] {reply.data.message}")
        assert isinstance(reply, protocol.PromptReply)
        return req.json_response(wire.prompt_blocks(reply.data.prompt))

    async def call(self, request: Request) -> Response:
        """Run a tool; stream ``task_id``, keepalives, then the result (or an ``error``)."""
        entry = self._entry(request, "/call")
        body = await req.body(request, wire.ToolCallRequest, entry.service)
        if body.task_id is not None:  # the SDK resumes a call whose stream broke
            task_id, running = body.task_id, entry.calls.get(body.task_id)
        else:
            if len(entry.running) >= MAX_QUEUED_CALLS:
                req.fail(
                    429,
                    f"this session has {MAX_QUEUED_CALLS} tool calls running or waiting, "
                    "the most one may; wait for their results",
                )
            task_id = os.urandom(16).hex()
            running = asyncio.create_task(self._call(entry, body.name, body.input))
            entry.calls[task_id] = running
            entry.running.add(running)
            running.add_done_callback(entry.running.discard)
            _forget_done(entry.calls)
        events = wire.call_events(task_id, running)
        return StreamingResponse(events, media_type="text/event-stream", headers=_STREAM_HEADERS)

    async def _call(self, entry: _Entry, name: str, arguments: dict[str, Any]) -> tuple[str, bytes]:
        """One tool call, in a task of its own: a client that leaves does not cut it short."""
        frame = protocol.request_frame("call_tool", {"name": name, "arguments": arguments})
        async with entry.lock:  # calls of one session never overlap
            if entry.ended is not None:  # it ended while this call waited its turn
                return "error", f"[SESSION_ERROR] the session has ended ({entry.ended})".encode()
            reply = await self._handle(entry, frame)
        await self._after_call(entry)
        if isinstance(reply, protocol.ToolResultReply):
            return "end", wire.tool_result(reply.data)
        assert isinstance(reply, protocol.ErrorReply)
        error = reply.data
        if (reason := wire.TOOL_ERROR_REASONS.get(error.code)) is not None:
            return "end", wire.tool_error_result(reason, error.message)
        # The tool raised or overran: OpenReward's SDK raises ToolFailed.
        return "error", f"[{error.code.value}] {error.message}".encode()

    async def _handle(self, entry: _Entry, frame: str) -> protocol.ServerMessage:
        entry.last_active = time.monotonic()
        try:
            reply = await entry.session.handle(frame)
        finally:
            entry.last_active = time.monotonic()
        assert reply is not None, "only a close request has no reply"
        return protocol.parse_server_message(reply)

    async def _after_call(self, entry: _Entry) -> None:
        """A fatal error (a blocking call past its deadline, bad requests in a row) ends it."""
        if entry.session.state is not SessionState.OPEN:
            await self._end(entry.sid, "fatal_error")

    async def _end(self, sid: str, reason: str, wait: float | None = None) -> None:
        """Close a session's environment and free its slot, once, after its call in flight."""
        entry = self.sessions.pop(sid, None)
        if entry is None:
            return
        entry.ended = self.ended.add(sid, reason)
        try:
            await asyncio.wait_for(entry.lock.acquire(), wait)
        except TimeoutError:
            entry.session.abandon()  # a shutdown's deadline: free the slot anyway
            # and end the calls' streams, which the server waits for before it stops.
            for task in entry.running:
                task.cancel()
            if entry.running:
                await asyncio.wait(entry.running)
        else:
            entry.lock.release()
        await entry.session.aclose(f"openreward_{reason}")

    # -- lifetime ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _running(self, env: str) -> AsyncIterator[None]:
        """While the app serves: reap ``env``'s idle sessions; at shutdown, close them all."""
        service = self.services[env]
        reaper = asyncio.create_task(self._reap(env, service))
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await self._drain(env)

    async def _drain(self, env: str) -> None:
        """End ``env``'s sessions here as a shutdown begins: their calls' streams hold it."""
        loop = asyncio.get_running_loop()
        mine = [sid for sid, e in self.sessions.items() if e.env == env and e.loop is loop]
        wait = self.services[env].settings.shutdown_timeout
        await asyncio.gather(*(self._end(sid, "shutdown", wait) for sid in mine))

    async def _reap(self, env: str, service: EnvService) -> None:
        limit = service.concurrency.session_timeout or DEFAULT_IDLE_TIMEOUT
        interval = service.settings.reap_interval or min(max(limit / 4, 0.01), 5.0)
        while True:
            await asyncio.sleep(interval)
            cutoff = time.monotonic() - limit
            for sid, entry in list(self.sessions.items()):
                if entry.env == env and not entry.lock.locked() and entry.last_active < cutoff:
                    logger.info("OpenReward session %s idle over %gs; closing", sid[:12], limit)
                    await self._end(sid, "idle_timeout")


def _forget_done(calls: OrderedDict[str, asyncio.Task[tuple[str, bytes]]]) -> None:
    """Forget the oldest finished calls past ``_CALLS_KEPT``: never one still running
    or waiting its turn, whose broken stream the SDK may yet resume (at most
    ``MAX_QUEUED_CALLS`` of those)."""
    extra = len(calls) - _CALLS_KEPT
    for task_id in [t for t, call in calls.items() if call.done()][: max(extra, 0)]:
        del calls[task_id]
