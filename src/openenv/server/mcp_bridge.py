"""MCP over streamable HTTP at ``/mcp``: an environment's tools for any MCP client.

Each MCP session gets its own environment instance, reset once when the
session opens, and counted against the same cap as WebSocket sessions. Its
slot is freed when the client ends the session (HTTP ``DELETE``), when the
session idles out, or when the server stops.

HTTP holds no connection to watch, so an MCP session costs its opener one
request: a session is cheap to refuse. One that has made no tool call is
closed after ``mcp_open_timeout`` (30 s), and one client address may hold
only ``mcp_sessions_per_client`` sessions (half the cap), so initialize-and-
vanish requests cannot lock WebSocket clients out. Without an API key, serve
MCP on trusted networks only.

Imported only when ``create_app(..., mcp=True)`` asks for it; it needs the
``openenv-scale[mcp]`` extra (the official ``mcp`` SDK).
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

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

try:
    import mcp_types as mcp
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
    from mcp.server.streamable_http_manager import (
        DEFAULT_SESSION_IDLE_TIMEOUT,
        StreamableHTTPSessionManager,
    )
    from mcp.shared.exceptions import MCPError
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    if exc.name is None or exc.name.split(".")[0] not in {"mcp", "mcp_types"}:
        raise
    raise ImportError(
        "serving MCP (mcp=True) needs the MCP SDK: pip install 'openenv-scale[mcp]'"
    ) from exc

from openenv import protocol
from openenv.protocol import ErrorCode, FrameError
from openenv.protocol_mcp_sessions import openenv_request
from openenv.server import calls
from openenv.server.http_bodies import BodyTooLarge, client_gone, read_body, replay
from openenv.server.mcp_messages import (
    client_address,
    is_initialize,
    opens_session,
    rpc_error,
    to_mcp,
)
from openenv.server.openenv_mcp import OpenEnvSessions
from openenv.server.service import EnvService, SessionRefused
from openenv.server.sessions import EnvFailure, Session, SessionState
from openenv.tools import tools_of

__all__ = ["McpBridge", "mcp_routes"]

logger = logging.getLogger("openenv.server")

_PLAY_AGAIN = (  # reset once, as it opened: the next episode is the next session's
    "an MCP session plays one episode: open a new session (initialize) to play "
    "another, and end this one (HTTP DELETE) to free its slot"
)


def mcp_routes(service: EnvService) -> list[BaseRoute]:
    """The ``/mcp`` route of ``service``; its session manager runs in the app's lifespan."""
    bridge = McpBridge(service)
    service.lifespan_hooks.extend((bridge.running, bridge.openenv.running))
    return [Route("/mcp", bridge, methods=["GET", "POST", "DELETE"])]


@dataclass
class _McpSession:
    session: Session
    client: str  # the remote address, for the per-client limit
    called: bool = False  # a tool call came; until then the short open timeout applies
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    in_flight: int = 0  # open HTTP requests, the GET event stream included
    calls: set[asyncio.Task[Any]] = field(default_factory=set)  # tool calls not yet done
    running: asyncio.Task[Any] | None = None  # the one of them that holds the lock
    last_active: float = field(default_factory=time.monotonic)
    ended: str | None = None  # why, once it is ending: calls still waiting their turn refuse


class McpBridge:
    """An ASGI app: the MCP SDK's session manager, plus one environment per MCP session."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        # HTTP has no disconnect to watch, so a vanished MCP client is found by idling.
        self.idle_timeout = service.concurrency.session_timeout or DEFAULT_SESSION_IDLE_TIMEOUT
        # Until its first tool call a session is only a promise: keep it briefly.
        self.open_timeout = min(service.settings.mcp_open_timeout, self.idle_timeout)
        self.per_client = service.settings.mcp_sessions_per_client or max(
            1, service.concurrency.max_concurrent_envs // 2
        )
        self._per_client: Counter[str] = Counter()  # sessions held or being opened
        self.openenv = OpenEnvSessions(  # OpenEnv's own /mcp sessions, beside MCP's
            service, self._per_client, self.per_client, self.idle_timeout, self.open_timeout
        )
        service.drain_hooks.append(self._drain)
        self.server: Server[Any] = Server(
            service.metadata.name,
            version=service.metadata.version or "",
            description=service.metadata.description or None,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.server.add_request_handler("server/discover", mcp.RequestParams, self._discover)
        self.sessions: dict[str, _McpSession] = {}
        # Sessions a fatal error ended, closing once their call's thread returns.
        self._closing: set[asyncio.Task[None]] = set()
        self._manager: StreamableHTTPSessionManager | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        # A manager runs only once, and the same app may be served again.
        self._manager = StreamableHTTPSessionManager(
            self.server,
            session_idle_timeout=self.idle_timeout,
            max_sessions=None,  # the service's cap counts MCP sessions
            max_request_body_size=self.service.settings.max_message_size,
        )
        reaper = asyncio.create_task(self._reap_idle())
        try:
            async with self._manager.run():
                yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            self._manager = None
            await self._drain()
            await self._closed_within(self.service.settings.shutdown_timeout)

    async def _drain(self) -> None:
        """End every session, as a shutdown begins: their calls' open responses hold it."""
        timeout = self.service.settings.shutdown_timeout
        await asyncio.gather(*(self._end(sid, "shutdown", timeout) for sid in list(self.sessions)))

    # -- HTTP ------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self._manager
        if manager is None:
            await JSONResponse({"detail": "MCP is not running"}, 503)(scope, receive, send)
            return
        body, raw = b"", receive
        if scope["method"] == "POST":
            # Read here, bounded, rather than whole by the SDK: and so an
            # environment is made only for a request that is an initialize.
            try:
                body = await read_body(scope, receive, self.service.settings.max_message_size)
            except BodyTooLarge as exc:
                await rpc_error(413, mcp.INVALID_REQUEST, str(exc))(scope, receive, send)
                return
            except ClientDisconnect:
                return
            receive = replay(body, receive)
        headers = Headers(scope=scope)
        sid = headers.get(MCP_SESSION_ID_HEADER)
        # OpenEnv's own client sends no session header: only such a body is looked into.
        if sid is None and body and (call := openenv_request(body)) is not None:
            await self.openenv.serve(call, scope, receive, send)
            return
        if sid is None and opens_session(headers) and is_initialize(body):
            await self._open(manager, scope, raw, body, send)
            return
        entry = self.sessions.get(sid) if sid is not None else None
        if entry is None:
            await manager.handle_request(scope, receive, send)
            return
        assert sid is not None
        if scope["method"] == "DELETE":
            send = self._ending(sid, send)
        entry.in_flight += 1
        try:
            await manager.handle_request(scope, receive, send)
        finally:
            entry.in_flight -= 1
            entry.last_active = time.monotonic()

    def _ending(self, sid: str, send: Send) -> Send:
        """``send`` that frees the session's slot before the client hears it ended.

        So a client whose close returned can open a new session at once.
        """

        async def end_then_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                await self._end(sid, "client_close")
            await send(message)

        return end_then_send

    async def _open(
        self,
        manager: StreamableHTTPSessionManager,
        scope: Scope,
        receive: Receive,
        body: bytes,
        send: Send,
    ) -> None:
        """Serve the initialize (``body``) that opens an MCP session, its environment ready."""
        client = client_address(scope)
        if self._per_client[client] >= self.per_client:
            message = (
                f"this client already holds {self._per_client[client]} MCP sessions, the "
                f"most one address may (mcp_sessions_per_client); end one (HTTP DELETE) first"
            )
            await rpc_error(429, mcp.INTERNAL_ERROR, message)(scope, receive, send)
            return
        self._per_client[client] += 1
        opened: list[str] = []  # the session id, once bound (then _end releases the client)
        try:
            await self._open_for(manager, client, opened, scope, receive, body, send)
        finally:
            if not opened:
                self._release_client(client)

    async def _open_for(
        self,
        manager: StreamableHTTPSessionManager,
        client: str,
        opened: list[str],
        scope: Scope,
        receive: Receive,
        body: bytes,
        send: Send,
    ) -> None:
        """``_open`` once the client may open one; a bound session's id goes in ``opened``."""
        service = self.service
        async with client_gone(receive) as left:  # one that leaves the line: no session
            try:
                session = await service.open_session(left)
            except SessionRefused as refused:
                # Full or shutting down: try again later (503); a broken factory: 500.
                status = 500 if refused.code is ErrorCode.FACTORY_ERROR else 503
                await rpc_error(status, mcp.INTERNAL_ERROR, refused.message)(scope, receive, send)
                return
            frame = await session.handle(protocol.request_frame("reset"))
        if left.is_set():
            # Gone while its environment was made: nobody will learn the session's
            # id, which would hold a slot until mcp_open_timeout.
            await session.aclose("mcp_client_gone")
            return
        assert frame is not None, "only a close request has no reply"
        reply = protocol.parse_server_message(frame)
        if isinstance(reply, protocol.ErrorReply):
            await session.aclose("mcp_reset_failed")
            await rpc_error(500, mcp.INTERNAL_ERROR, reply.data.message)(scope, receive, send)
            return
        session.play_again = _PLAY_AGAIN
        entry = _McpSession(session, client, in_flight=1)
        receive = replay(body, receive)  # the initialize, for the SDK to read

        async def bind_on_start(message: Message) -> None:
            # Bind before the client can learn the session id, so its next
            # request always finds the environment.
            if message["type"] == "http.response.start" and message["status"] < 400:
                sid = MutableHeaders(raw=message["headers"]).get(MCP_SESSION_ID_HEADER)
                if sid is not None:
                    self.sessions[sid] = entry
                    opened.append(sid)
            await send(message)

        try:
            await manager.handle_request(scope, receive, bind_on_start)
        finally:
            entry.in_flight -= 1
            entry.last_active = time.monotonic()
            if not opened:  # not an initialize, or refused: nothing to keep
                await session.aclose("mcp_open_failed")

    def _release_client(self, client: str) -> None:
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]

    async def _end(self, sid: str, reason: str, wait: float | None = None) -> None:
        entry = self.sessions.pop(sid, None)
        if entry is not None:
            entry.ended = reason.replace("_", " ")
            self._release_client(entry.client)
            await self._close(entry, reason, wait)

    async def _close(self, entry: _McpSession, reason: str, wait: float | None = None) -> None:
        """Close the session's environment once its tool call in flight is done; past
        ``wait`` (a shutdown's deadline), free its slot without waiting for it."""
        try:
            await asyncio.wait_for(entry.lock.acquire(), wait)
        except TimeoutError:
            # close() must not run beside a call still on its thread: left undone.
            entry.session.abandon()
            for call in entry.calls:
                call.cancel()
            await entry.session.aclose(reason)
            return
        try:
            await entry.session.aclose(reason)
        finally:
            entry.lock.release()

    def _end_soon(self, sid: str, reason: str) -> None:
        """``_end``, its close in a task: ``close()`` may wait for a thread still
        in a call, and the reply that says the session ended must not."""
        entry = self.sessions.pop(sid, None)
        if entry is None:
            return
        entry.ended = reason.replace("_", " ")
        self._release_client(entry.client)
        task = asyncio.create_task(self._close(entry, reason))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _closed_within(self, timeout: float | None) -> None:
        """Wait for the sessions ``_end_soon`` is closing; past ``timeout``, free
        their slots without waiting for their threads (as a shutdown does)."""
        if not self._closing:
            return
        _, pending = await asyncio.wait(self._closing, timeout=timeout)
        for task in pending:
            task.cancel()  # aclose() frees the slot as it unwinds, without close()
        if pending:
            await asyncio.wait(pending)

    async def _reap_idle(self) -> None:
        interval = min(max(self.open_timeout / 4, 0.01), 5.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for sid, entry in list(self.sessions.items()):
                timeout = self.idle_timeout if entry.called else self.open_timeout
                if entry.in_flight == 0 and entry.last_active < now - timeout:
                    if entry.called:
                        logger.info("MCP session %s idle over %gs; closing", sid, timeout)
                    else:
                        logger.info(
                            "MCP session %s made no tool call in %gs; closing", sid, timeout
                        )
                    await self._end(sid, "idle_timeout")
                    await self._terminate(sid)

    async def _terminate(self, sid: str) -> None:
        """End the SDK's side of a session too, as the client's ``DELETE`` would.

        Otherwise its transport would wait out the SDK's own idle timeout:
        memory that initialize-and-vanish clients could pile up.
        """
        manager = self._manager
        if manager is None:
            return
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "DELETE",
            "scheme": "http",
            "path": "/mcp",
            "raw_path": b"/mcp",
            "query_string": b"",
            "root_path": "",
            "headers": [(MCP_SESSION_ID_HEADER.encode(), sid.encode())],
            "client": None,
            "server": None,
        }

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def discard(message: Message) -> None:
            pass

        await manager.handle_request(scope, receive, discard)

    # -- MCP handlers ----------------------------------------------------------

    def _entry(self, ctx: Any) -> _McpSession:
        request = ctx.request
        sid = request.headers.get(MCP_SESSION_ID_HEADER) if request is not None else None
        entry = self.sessions.get(sid) if sid is not None else None
        if entry is None:
            raise MCPError(
                code=mcp.INVALID_REQUEST,
                message="no environment for this request: each MCP session owns one, so "
                "connect with the initialize handshake (a stateful streamable HTTP session); "
                "a session that made no tool call within mcp_open_timeout, idled out or "
                "failed fatally has lost its environment: open a new one",
            )
        return entry

    async def _discover(self, ctx: Any, params: mcp.RequestParams) -> mcp.DiscoverResult:
        # An environment lives in a session, and the sessionless 2026 protocol
        # has none to keep it in: advertise only the handshake versions, so
        # `auto` clients fall back to initialize.
        return mcp.DiscoverResult(
            supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
            capabilities=self.server.get_capabilities(),
        )

    async def _list_tools(
        self, ctx: Any, params: mcp.PaginatedRequestParams | None
    ) -> mcp.ListToolsResult:
        env_cls = self.service.env_cls
        entry = self.sessions.get(
            ctx.request.headers.get(MCP_SESSION_ID_HEADER, "") if ctx.request else ""
        )
        specs = entry.session.tools if entry is not None else tools_of(env_cls) if env_cls else {}
        return mcp.ListToolsResult(
            tools=[
                mcp.Tool(
                    name=spec.info.name,
                    description=spec.info.description,
                    input_schema=spec.info.input_schema,
                )
                for spec in specs.values()
            ]
        )

    async def _call_tool(self, ctx: Any, params: mcp.CallToolRequestParams) -> mcp.CallToolResult:
        entry = self._entry(ctx)
        entry.called = True
        sid = ctx.request.headers[MCP_SESSION_ID_HEADER]
        call = asyncio.ensure_future(self._run_tool(entry, sid, params))
        entry.calls.add(call)
        call.add_done_callback(entry.calls.discard)
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            # The client cancelled the request (MCP's notifications/cancelled; its
            # SDK sends one when a call times out). A call still waiting its turn
            # never runs, and an async def tool stops here; a plain def one that
            # began runs on in its thread, which nothing can stop, holding the
            # session's lock until it returns: its next call and its close()
            # wait for it, and its slot is not freed beside it.
            spec = entry.session.tools.get(params.name)
            if entry.running is not call or spec is None or calls.is_async(spec.fn):
                call.cancel()
            raise

    async def _run_tool(
        self, entry: _McpSession, sid: str, params: mcp.CallToolRequestParams
    ) -> mcp.CallToolResult:
        async with entry.lock:  # calls of one session never overlap
            if entry.ended is not None:
                # It ended while this call waited its turn: a call before it may
                # still run on its thread, with the environment.
                ended = f"[SESSION_ERROR] the session has ended ({entry.ended}); open a new one"
                raise MCPError(code=mcp.INVALID_REQUEST, message=ended)
            entry.running = asyncio.current_task()
            entry.session.last_active = time.monotonic()
            started = time.time()
            arguments = params.arguments or {}
            try:
                output = await entry.session.call_tool(params.name, arguments)
                self._record(entry.session.id, started, params.name, arguments, output)
            except (FrameError, EnvFailure) as exc:
                self._record(entry.session.id, started, params.name, arguments, exc)
                if entry.session.state is not SessionState.OPEN:  # a fatal error ended it
                    self._end_soon(sid, "fatal_error")
                else:  # counted as on /ws (a fatal one was, as it ended the session)
                    self.service.metrics.errors[exc.code.value] += 1
                if exc.code is ErrorCode.UNKNOWN_TOOL:
                    raise MCPError(code=mcp.INVALID_PARAMS, message=exc.message) from None
                # Bad arguments, a finished episode, a failing tool: the model
                # sees the message and can correct itself (MCP's isError).
                text = f"[{exc.code.value}] {exc.message}"
                return mcp.CallToolResult(content=[mcp.TextContent(text=text)], is_error=True)
            finally:
                entry.running = None
        return to_mcp(output)

    def _record(
        self, session: str, started: float, name: str, arguments: Any, outcome: Any
    ) -> None:
        recorder = self.service.recorder
        if recorder is None:
            return
        # As the call_tool frame a WebSocket client would have sent, and its reply.
        request = protocol.request_frame("call_tool", {"name": name, "arguments": arguments})
        if isinstance(outcome, FrameError | EnvFailure):
            reply = protocol.error_frame(outcome.code, outcome.message)
        else:
            reply = protocol.tool_result_frame(outcome)
        recorder.call(session, started, request, reply)
