"""OpenEnv's own ``/mcp`` sessions, so OpenEnv 0.10's ``MCPToolClient`` works unchanged.

That client speaks only OpenEnv's session methods (``openenv/protocol_mcp_sessions.py``
has the wire): ``openenv/session/create`` opens a session, ``tools/list`` and
``tools/call`` name it in ``params.session_id``, ``/ws?session_id=<id>``
attaches a WebSocket that resets and steps the same environment, and
``openenv/session/close`` ends it. ``McpBridge`` (``server/mcp_bridge.py``)
hands such requests here; the MCP SDK's streamable HTTP is untouched.

A session here is a ``SharedSession``: its slot comes from the service like
every other (the cap, the line, ``queue_timeout``, refused while draining),
its requests never overlap, and its WebSocket leaving leaves it open (as on
OpenEnv's server). HTTP has nothing to watch, so it ends on
``openenv/session/close``, on idling past ``session_timeout`` with no
WebSocket attached (the MCP bridge's idle timeout: 30 minutes when none is
set), on a fatal error and on shutdown; one that nobody used after its
``create`` ends after ``mcp_open_timeout``, and one address may hold only
``mcp_sessions_per_client`` of these and MCP's sessions together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from openenv import protocol
from openenv import protocol_mcp_sessions as wire
from openenv.protocol import CloseCode, ErrorCode
from openenv.protocol_errors import summarise
from openenv.server.http_bodies import client_gone
from openenv.server.mcp_messages import client_address
from openenv.server.service import EnvService, SessionRefused
from openenv.server.session_host import SessionState
from openenv.server.session_ids import EndedSessions, SessionIds
from openenv.server.sessions import Session
from openenv.server.shared_session import SharedSession

__all__ = ["OpenEnvSessions"]

logger = logging.getLogger("openenv.server")

# openenv's error codes as JSON-RPC's: the caller's mistakes are invalid params.
_RPC_CODES = {
    ErrorCode.UNKNOWN_TOOL: wire.INVALID_PARAMS,
    ErrorCode.VALIDATION_ERROR: wire.INVALID_PARAMS,
    ErrorCode.EPISODE_FINISHED: wire.INVALID_REQUEST,
}


@dataclass
class _Entry:
    session: SharedSession
    client: str  # the remote address, for the per-client limit
    used: bool = False  # asked something since its create: the idle timeout applies
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    # Its tool calls in flight: a shutdown past its deadline cancels them, as
    # their open responses would hold the server's shutdown for as long as they run.
    calls: set[asyncio.Task[str | None]] = field(default_factory=set)


class OpenEnvSessions:
    """The sessions OpenEnv's ``MCPToolClient`` opens at ``/mcp``, for one service."""

    def __init__(
        self,
        service: EnvService,
        per_client: Counter[str],
        per_client_limit: int,
        idle_timeout: float,
        open_timeout: float,
    ) -> None:
        self.service = service
        self._per_client = per_client  # shared with MCP's sessions: one limit for both
        self.per_client_limit = per_client_limit
        self.idle_timeout = idle_timeout
        self.open_timeout = open_timeout
        self.ids = SessionIds()
        self.ended = EndedSessions()
        self.sessions: dict[str, _Entry] = {}
        # Sessions a fatal error ended, closing once their call's thread returns.
        self._closing: set[asyncio.Task[None]] = set()
        service.attach_session = self.attach
        service.drain_hooks.append(self.drain)

    # -- HTTP ------------------------------------------------------------------

    async def serve(
        self,
        request: wire.RpcRequest | wire.BadRequest,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Answer one request (always HTTP 200: the client reads errors after
        ``raise_for_status()``)."""
        if isinstance(request, wire.BadRequest):
            reply = wire.error(request.id, wire.INVALID_REQUEST, request.message)
        else:
            reply = await self._answer(request, scope, receive)
        response = Response(wire.reply_text(reply), media_type="application/json")
        await response(scope, receive, send)

    async def _answer(
        self, request: wire.RpcRequest, scope: Scope, receive: Receive
    ) -> dict[str, Any]:
        rid, method = request.id, request.method
        if method == wire.CREATE:
            return await self._create(rid, scope, receive)
        if method not in (wire.CLOSE, wire.TOOLS_LIST, wire.TOOLS_CALL):
            return wire.error(
                rid,
                wire.METHOD_NOT_FOUND,
                f"Method not found: {method} (OpenEnv's /mcp sessions have "
                f"{wire.CREATE}, {wire.TOOLS_LIST}, {wire.TOOLS_CALL} and {wire.CLOSE})",
            )
        model = wire.CallParams if method == wire.TOOLS_CALL else wire.SessionParams
        try:
            params = model.model_validate(request.params)
        except ValidationError as exc:
            return wire.error(rid, wire.INVALID_PARAMS, f"Invalid params - {summarise(exc)}")
        sid = params.session_id
        if method == wire.CLOSE:
            return await self._close(rid, sid)
        entry = self.sessions.get(sid)
        if entry is None:
            return wire.error(rid, wire.INVALID_PARAMS, self._unknown(sid))
        entry.used = True
        session = entry.session
        session.last_active = time.monotonic()
        if isinstance(params, wire.CallParams):
            return await self._call(rid, sid, entry, params)
        return wire.result(rid, wire.tool_list([s.info for s in session.tools.values()]))

    async def _create(self, rid: Any, scope: Scope, receive: Receive) -> dict[str, Any]:
        client = client_address(scope)
        if self._per_client[client] >= self.per_client_limit:
            return wire.error(
                rid,
                wire.SERVER_ERROR,
                f"this client already holds {self._per_client[client]} sessions at /mcp, the "
                f"most one address may (mcp_sessions_per_client); close one "
                f"({wire.CLOSE}) first",
            )
        self._per_client[client] += 1
        try:
            async with client_gone(receive) as left:  # one that leaves the line: no session
                session = await self.service.open_session(left, SharedSession)
        except SessionRefused as refused:
            self._release(client)
            data = {"code": refused.code.value, **refused.details}
            return wire.error(rid, wire.SERVER_ERROR, refused.message, data)
        except BaseException:
            self._release(client)
            raise
        assert isinstance(session, SharedSession)
        if left.is_set():
            # Gone while its environment was made: nobody will learn the session's
            # id, which would hold a slot until mcp_open_timeout.
            self._release(client)
            await session.aclose("openenv_mcp_client_gone")
            return wire.error(rid, wire.SERVER_ERROR, "the client left before its session opened")
        sid = self.ids.new()
        session.on_closed = self._closed
        self.sessions[sid] = _Entry(session, client)
        logger.debug("OpenEnv /mcp session %s opened (session %s)", sid[:12], session.id)
        return wire.result(rid, wire.Created(session_id=sid).model_dump())

    async def _close(self, rid: Any, sid: str) -> dict[str, Any]:
        entry = self.sessions.get(sid)
        if entry is None:
            return wire.error(rid, wire.INVALID_PARAMS, self._unknown(sid))
        session = entry.session
        if session.attached:  # as OpenEnv's: it ends when its WebSocket leaves
            session.close_pending = True
            closed = wire.Closed(session_id=sid, closed=False, closing=True)
            return wire.result(rid, closed.model_dump())
        await self._end(sid, "client_close")
        return wire.result(rid, wire.Closed(session_id=sid, closed=True).model_dump())

    async def _call(
        self, rid: Any, sid: str, entry: _Entry, params: wire.CallParams
    ) -> dict[str, Any]:
        session = entry.session
        frame = protocol.request_frame(
            "call_tool", {"name": params.name, "arguments": params.arguments}
        )
        # Waits for a step of its WebSocket in flight; a task, for drain() to cancel.
        call = asyncio.ensure_future(session.handle(frame))
        entry.calls.add(call)
        call.add_done_callback(entry.calls.discard)
        try:
            text = await call
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not call.cancelled() or (current is not None and current.cancelling()):
                raise
            # A shutdown past its deadline gave up on the call (drain).
            message = "[SESSION_ERROR] the session has ended (shutdown)"
            return wire.error(rid, wire.SERVER_ERROR, message, {"code": "SESSION_ERROR"})
        session.last_active = time.monotonic()
        assert text is not None, "only a close request has no reply"
        reply = protocol.parse_server_message(text)
        if session.state is not SessionState.OPEN and not session.ending:
            # A fatal error ended it (not a close, which has begun and says why):
            # its reply must not wait for close(), which waits for a call
            # overrunning its deadline to return.
            self._end_soon(sid, "fatal_error")
        if isinstance(reply, protocol.ToolResultReply):
            return wire.result(rid, wire.tool_call_result(reply.data))
        assert isinstance(reply, protocol.ErrorReply)
        failure = reply.data
        code = _RPC_CODES.get(failure.code, wire.INTERNAL_ERROR)
        details = failure.model_dump(mode="json", exclude={"message"})
        return wire.error(rid, code, f"[{failure.code.value}] {failure.message}", details)

    def _unknown(self, sid: str) -> str:
        shown = repr(sid[:64])
        if (why := self.ended.get(sid)) is not None:
            return f"session {shown} has ended ({why}); create a new one ({wire.CREATE})"
        return f"Unknown session_id: {shown}; create one first ({wire.CREATE})"

    # -- the WebSocket ---------------------------------------------------------

    def attach(self, sid: str) -> Session:
        """The session ``/ws?session_id=<sid>`` drives; ``SessionRefused`` if none may."""
        entry = self.sessions.get(sid)
        if entry is None:
            raise SessionRefused(
                ErrorCode.SESSION_ERROR, self._unknown(sid), CloseCode.POLICY_VIOLATION
            )
        session = entry.session
        if session.ending:  # closed while its last WebSocket left: not for another
            raise SessionRefused(
                ErrorCode.SESSION_ERROR,
                f"session {sid[:64]!r} is closing; create a new one ({wire.CREATE})",
                CloseCode.POLICY_VIOLATION,
            )
        if session.attached:
            raise SessionRefused(
                ErrorCode.SESSION_ERROR,
                f"session {sid[:64]!r} already has an attached WebSocket; close it first "
                f"(one WebSocket at a time drives a session)",
                CloseCode.POLICY_VIOLATION,
            )
        session.attached = True
        entry.used = True
        return session

    # -- ending ----------------------------------------------------------------

    async def _end(self, sid: str, reason: str) -> None:
        """Close the session (after its request in flight) and free its slot."""
        entry = self.sessions.get(sid)
        if entry is not None:
            await entry.session.aclose(f"openenv_mcp_{reason}")

    def _end_soon(self, sid: str, reason: str) -> None:
        """``_end``, its close in a task; the session forgotten now."""
        entry = self.sessions.pop(sid, None)
        if entry is None:
            return
        self._release(entry.client)
        self.ended.add(sid, reason)
        task = asyncio.create_task(entry.session.aclose(f"openenv_mcp_{reason}"))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _closed(self, session: SharedSession, reason: str) -> None:
        """A session closed, whoever closed it: forget it."""
        for sid, entry in list(self.sessions.items()):
            if entry.session is session:
                del self.sessions[sid]
                self._release(entry.client)
                self.ended.add(sid, reason.removeprefix("openenv_mcp_"))

    def _release(self, client: str) -> None:
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """While the app serves: reap idle sessions; at its end, close those left."""
        reaper = asyncio.create_task(self._reap())
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await self.drain()

    async def drain(self) -> None:
        """End the sessions no WebSocket drives (the service drains those), within
        ``shutdown_timeout``; past it, free their slots without waiting for a call,
        and answer the tool calls still running (their open responses hold the
        server's shutdown), attached sessions' too."""
        loop = asyncio.get_running_loop()
        entries = [e for e in self.sessions.values() if e.loop is loop]
        closing = [
            asyncio.ensure_future(e.session.aclose("openenv_mcp_shutdown"))
            for e in entries
            if not e.session.attached
        ]
        ending = [t for t in self._closing if t.get_loop() is loop]
        waited = [*closing, *ending, *(call for e in entries for call in e.calls)]
        if not waited:
            return
        _, pending = await asyncio.wait(waited, timeout=self.service.settings.shutdown_timeout)
        if not pending:
            return
        for entry in entries:
            if entry.session.state is not SessionState.CLOSED:
                entry.session.abandon()  # before the cancel: no close() beside the thread
            for call in list(entry.calls):
                call.cancel()
        for task in ending:
            task.cancel()  # aclose() frees the slot as it unwinds, without close()
        await asyncio.wait(pending)

    async def _reap(self) -> None:
        interval = min(max(self.open_timeout / 4, 0.01), 5.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for sid, entry in list(self.sessions.items()):
                session = entry.session
                limit = self.idle_timeout if entry.used else self.open_timeout
                if (
                    not session.attached
                    and not session.lock.locked()
                    and session.last_active < now - limit
                ):
                    logger.info("OpenEnv /mcp session %s idle over %gs; closing", sid[:12], limit)
                    await self._end(sid, "idle_timeout")
