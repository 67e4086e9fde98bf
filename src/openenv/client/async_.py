"""The asyncio client: one WebSocket connection, one session on the server."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import BaseModel
from websockets.exceptions import ConnectionClosed

from openenv import protocol
from openenv.client._base import (
    ActT,
    AnyObservation,
    ClientCore,
    ObsT,
    StateT,
    handshake_headers,
    http_url,
    ws_url,
)
from openenv.client.loop_aware import abandoned, close_when_dropped, cut, loop_aware
from openenv.client.placement import PoolPlacement
from openenv.client.pool import ServerPool, as_pool
from openenv.client.sockets import close_by, closed_error, deadline_in, open_socket
from openenv.client.sync import run_sync
from openenv.errors import (
    EnvTimeoutError,
    SessionClosedError,
    shown_url,
)
from openenv.tasks import TaskSpec
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import Action, Observation, State, StepResult

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from openenv.client.sync import SyncEnvClient

__all__ = ["EnvClient", "WebSocketEnvClient"]

# "Not given" for options where None already means "off".
_UNSET: Any = object()


class EnvClient(ClientCore[ActT, ObsT, StateT], PoolPlacement):
    """A typed client for one environment session, async or blocking.

    Subclass it with your models as generic arguments; replies are parsed
    into them for you. The connection opens on first use or on ``async with``
    (or ``with``). Inside a running event loop every method is awaitable;
    called from plain synchronous code (no event loop in the thread, as TRL
    and OpenEnv users call it) it blocks and returns the result instead.

    >>> import asyncio
    >>> from openenv import EnvClient, State
    >>> from echo_env.models import EchoAction, EchoObservation
    >>> class EchoEnv(EnvClient[EchoAction, EchoObservation, State]):
    ...     pass
    >>> async def play(url: str) -> float | None:
    ...     async with EchoEnv(url) as env:
    ...         await env.reset(seed=1)
    ...         result = await env.step(EchoAction(message="hello"))
    ...         return result.reward
    >>> asyncio.run(play(ECHO_URL))  # doctest: +SKIP
    0.5
    >>> with EchoEnv(base_url=ECHO_URL) as env:  # doctest: +SKIP
    ...     env.reset().done, env.step(EchoAction(message="hello")).reward
    (False, 0.5)

    Args:
        base_url: ``http(s)://host:port`` or ``ws(s)://host:port/ws``; or a
            ``ServerPool`` (or URLs joined by commas) to open the session on
            whichever server has the most room.
        connect_timeout: Seconds to open the connection before giving up.
        message_timeout: Seconds to wait for each reply (``None``: forever).
        ping_interval: Seconds between keepalive pings (``None``: off).
        ping_timeout: Seconds to wait for a pong before the connection is
            considered dead.
        max_size: Largest reply frame accepted, in bytes.
        api_key: The server's API key (default: ``$OPENENV_API_KEY``).
        headers: Extra HTTP headers for the WebSocket handshake.
        connect_timeout_s, message_timeout_s, max_message_size_mb,
        websocket_ping_interval_s, websocket_ping_timeout_s: OpenEnv's
            spellings of the options above, accepted so its users' code runs
            unchanged; they win over the options above when both are given.
    """

    def __init__(
        self,
        base_url: str | ServerPool,
        *,
        connect_timeout: float = 10.0,
        message_timeout: float | None = 60.0,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        max_size: int | None = 2**24,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float | None = None,
        message_timeout_s: float | None = None,
        max_message_size_mb: float | None = None,
        websocket_ping_interval_s: float | None = _UNSET,
        websocket_ping_timeout_s: float | None = _UNSET,
    ) -> None:
        if connect_timeout_s is not None:
            connect_timeout = connect_timeout_s
        if message_timeout_s is not None:
            message_timeout = message_timeout_s
        if max_message_size_mb is not None:
            max_size = int(max_message_size_mb * 1024 * 1024)
        if websocket_ping_interval_s is not _UNSET:
            ping_interval = websocket_ping_interval_s
        if websocket_ping_timeout_s is not _UNSET:
            ping_timeout = websocket_ping_timeout_s
        self.pool = as_pool(base_url)
        # With a pool, the server is chosen when the session opens.
        self.url = ws_url(self.pool.urls[0] if self.pool is not None else str(base_url))
        self._placed = False  # holding a slot of the pool's count
        self._admitted = self.pool is None  # a server has accepted the session
        self.connect_timeout = connect_timeout
        self.message_timeout = message_timeout
        self._connect_options: dict[str, Any] = {
            "ping_interval": ping_interval,
            "ping_timeout": ping_timeout,
            "max_size": max_size,
            "open_timeout": connect_timeout,
            "close_timeout": 5,
            # Replies are small and latency-bound; compression only costs CPU here.
            "compression": None,
        }
        # The pool's key opens the sessions it places, unless this client has its own.
        key = api_key or (self.pool.api_key if self.pool is not None else None)
        extra_headers = handshake_headers(headers, key)
        if extra_headers:
            self._connect_options["additional_headers"] = extra_headers
        self._ws: ClientConnection | None = None
        # The loop the connection lives on; calls from elsewhere are carried to it.
        self.home_loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        # One connection however many calls make the first one at once; a lock
        # of the loop connecting (a lock waited on is bound to its loop, and a
        # failed first connect may be retried from another).
        self._connecting = asyncio.Lock()
        self._connecting_loop: asyncio.AbstractEventLoop | None = None
        # Replies the server still owes on this connection: one per request sent,
        # less those read. More than one means calls given up on (timed out,
        # cancelled) whose replies are still to come: v1 replies carry no id.
        self._owed = 0
        self._closed = False
        # Closes the connection if this client is garbage-collected unclosed.
        self._on_drop: weakref.finalize[Any, Any] | None = None

    @property
    def base_url(self) -> str:
        """The server's HTTP root (OpenEnv's attribute), e.g. ``http://localhost:8000``."""
        return http_url(self.url)

    @loop_aware
    async def connect(self) -> Self:
        """Open the connection (and with it a server-side session)."""
        return await self._connect()

    async def _connect(self) -> Self:
        if self._ws is not None:
            return self
        # Calls that find no connection wait for the first one's: each opening
        # its own would split the session in two (a reset on one, steps on the
        # other) and leave one holding a slot no one closes.
        loop = asyncio.get_running_loop()
        if self._connecting_loop is not loop:
            # Connected nowhere and connecting nowhere (or on_home_loop would
            # have carried this call there): a new loop's calls need a lock of it.
            self._connecting, self._connecting_loop = asyncio.Lock(), loop
        async with self._connecting:
            if self._ws is None:
                await self._connect_once()
        return self

    async def _connect_once(self) -> None:
        if self._closed:
            raise SessionClosedError("this client was closed; create a new one")
        # Home from the start: a call from another loop meanwhile waits for this
        # connection here rather than opening its own.
        self.home_loop = asyncio.get_running_loop()
        try:
            await self._open_connection()
        finally:
            if self._ws is None:
                # Nothing was opened on this loop: a retry may come from another
                # (a new asyncio.run once the server is up) and must be let in.
                self.home_loop = None

    async def _opened(self, url: str) -> ClientConnection:
        ws = await self._open(url)
        if self._closed:  # close() came while the handshake ran: nobody will use it
            await ws.close()
            raise SessionClosedError("this client was closed; create a new one")
        self._forget_drop()
        self._on_drop = close_when_dropped(self, ws.transport, asyncio.get_running_loop())
        return ws

    def _forget_drop(self) -> None:
        if self._on_drop is not None:
            self._on_drop.detach()
            self._on_drop = None

    async def _open(self, url: str) -> ClientConnection:
        return await open_socket(url, self.connect_timeout, self._connect_options)

    @loop_aware
    async def reset(
        self, /, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> StepResult[ObsT]:
        """Start a new episode; extra keyword arguments (``task=...``) go to ``reset``."""
        data = self.encode_reset(seed, episode_id, kwargs)
        return self.decode_result(await self._request("reset", data))

    @loop_aware
    async def step(self, action: ActT | dict[str, Any]) -> StepResult[ObsT]:
        """Apply one action and return the observation, reward and done flag."""
        return self.decode_result(await self._request("step", self.encode_action(action)))

    @loop_aware
    async def state(self) -> StateT:
        """The environment's current state."""
        return self.decode_state(await self._request("state"))

    @loop_aware
    async def list_tools(self) -> list[ToolInfo]:
        """The environment's tools: names, descriptions, JSON Schemas of their arguments."""
        return self.decode_tools(await self._request("list_tools"))

    @loop_aware
    async def call_tool(
        self,
        /,
        name: str,
        arguments: Mapping[str, Any] | BaseModel | None = None,
        **kwargs: Any,
    ) -> ToolOutput:
        """Call a tool by name: ``call_tool("increment", {"amount": 2})`` or ``amount=2``.

        Raises:
            UnknownToolError: no tool by that name (``.tools`` lists the real ones).
            EnvValidationError: the arguments do not fit the tool's schema.
            EpisodeFinishedError: a tool ended the episode; ``reset`` first.
            EnvExecutionError: the tool raised.
        """
        data = self.encode_tool_call(name, arguments, kwargs)
        return self.decode_tool_result(await self._request("call_tool", data))

    @loop_aware
    async def get_prompt(self, task: TaskSpec | None = None) -> str:
        """The prompt of ``task``, by default the task the episode was reset with."""
        data = {} if task is None else {"task": task.model_dump(mode="json")}
        return self.decode_prompt(await self._request("get_prompt", data))

    def close(self) -> Coroutine[Any, Any, None]:
        """End the session; the server closes the environment. Idempotent.

        Returns once the server has closed the environment and freed the slot,
        so a new session can take it right away; or, if that takes longer than
        ``connect_timeout`` (a call of another coroutine still runs, the server
        is hung), after closing the connection: the server frees the slot when
        the running call ends, and that call raises ``SessionClosedError``.
        A connection whose event loop has stopped (an ``asyncio.run`` that
        returned) is cut, and the server frees the slot.
        """
        home = self.home_loop
        if home is not None and abandoned(home):
            # Nothing runs its loop to close it there: the session would hold
            # its slot for as long as this object lives.
            ws, self._ws, self.home_loop = self._ws, None, None
            self._forget_drop()
            if ws is not None:
                cut(ws.transport, home)
        return self._end()

    @loop_aware
    async def _end(self) -> None:
        self._closed = True
        if self.pool is not None:
            self._unplace(self.pool.ended)
        ws, self._ws = self._ws, None
        self.home_loop = None
        self._forget_drop()
        if ws is None:
            return
        deadline = deadline_in(self.connect_timeout)  # one limit for all of closing
        try:
            async with asyncio.timeout_at(deadline):
                async with self._lock:  # after a call in flight, not inside its reply
                    await ws.send(protocol.request_frame("close"))
                # The server closes the socket after freeing the slot; starting the
                # close handshake here instead would let the WebSocket layer answer
                # it before the slot is free.
                await ws.wait_closed()
        except (ConnectionClosed, TimeoutError):
            pass
        finally:
            await close_by(ws, deadline)

    def sync(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        """A blocking client with the same methods, for code that is not async."""
        from openenv.client.sync import SyncEnvClient

        return SyncEnvClient(self)

    async def __aenter__(self) -> Self:
        return await self.connect()

    def __enter__(self) -> Self:
        # Blocking even inside a running loop: the connection then lives on
        # the background loop, and later awaits are carried over to it.
        return run_sync(self._connect())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        run_sync(self._close_from_anywhere())

    async def _close_from_anywhere(self) -> None:
        await self.close()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _request(
        self,
        kind: Literal["reset", "step", "state", "list_tools", "call_tool", "get_prompt"],
        data: dict[str, Any] | None = None,
    ) -> str | bytes:
        frame = protocol.request_frame(kind, data)
        if self.on_exchange is None:
            return await self._placed_request(kind, frame)
        started = time.time()
        reply = await self._placed_request(kind, frame)
        self.on_exchange(frame, reply, started)
        return reply

    async def _exchange(self, kind: str, frame: str) -> str | bytes:
        await self._connect()
        ws = self._ws
        if ws is None:
            raise SessionClosedError("this client was closed; create a new one")
        async with self._lock:
            # Owed from here: websockets writes a whole frame before its first
            # await, so even a call cancelled inside send() has asked.
            self._owed += 1
            sent = False
            try:
                # The send too: a server that stopped reading never takes a frame
                # larger than the socket's buffers. Given up on, it is still
                # whole in the buffer; a later call skips its reply (_owed).
                async with asyncio.timeout(self.message_timeout):
                    await ws.send(frame)
                    sent = True
                    return await self._reply(ws)
            except TimeoutError:
                raise EnvTimeoutError(
                    f"no reply to {kind!r} within {self.message_timeout}s "
                    f"from {shown_url(self.url)}"
                ) from None
            except ConnectionClosed as exc:
                if not sent:  # the server may have said why (e.g. at capacity) before closing
                    return await self._last_words(ws, exc)
                raise closed_error(exc) from None

    async def _reply(self, ws: ClientConnection) -> str | bytes:
        """The next message after the replies owed to calls given up on, which the
        server, answering in order, sends first."""
        while self._owed > 1:
            await ws.recv()
            self._owed -= 1
        reply = await ws.recv()
        self._owed -= 1
        return reply

    async def _last_words(self, ws: ClientConnection, exc: ConnectionClosed) -> str | bytes:
        try:
            async with asyncio.timeout(1.0):
                return await self._reply(ws)
        except (ConnectionClosed, TimeoutError):
            raise closed_error(exc) from None


class WebSocketEnvClient(EnvClient[Action, Observation, State]):
    """An ``EnvClient`` whose model classes are passed in rather than declared.

    >>> from openenv import WebSocketEnvClient
    >>> from echo_env.models import EchoAction, EchoObservation
    >>> client = WebSocketEnvClient("http://localhost:8000",
    ...                             action_cls=EchoAction, observation_cls=EchoObservation)
    >>> client.url
    'ws://localhost:8000/ws'
    """

    def __init__(
        self,
        base_url: str | ServerPool,
        *,
        action_cls: type[Action] = Action,
        observation_cls: type[Observation] = AnyObservation,
        state_cls: type[State] = State,
        **options: Any,
    ) -> None:
        super().__init__(base_url, **options)
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.state_cls = state_cls
