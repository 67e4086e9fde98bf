"""Many sessions over one WebSocket (protocol v2), stepped one at a time or in batches.

``MuxClient`` opens one connection; ``open(n)`` makes ``n`` sessions on it,
each with its own environment and slot on the server. A batch call sends one
frame for all its sessions and returns their results in order; the calls of
single sessions made by many coroutines at once are gathered into one frame
too. The wire is in ``openenv/protocol_v2.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import orjson
from pydantic import BaseModel

from openenv import protocol, protocol_v2
from openenv.client._base import (
    ActT,
    AnyObservation,
    ClientCore,
    ObsT,
    StateT,
    handshake_headers,
    ws_url,
)
from openenv.client.loop_aware import abandoned, close_when_dropped, cut
from openenv.client.mux_wire import Kind, MuxWire
from openenv.client.open_sessions import OpenSessions
from openenv.client.sockets import close_by, deadline_in, open_socket
from openenv.errors import (
    ConnectionFailedError,
    EnvTimeoutError,
    SessionClosedError,
    shown_url,
)
from openenv.tasks import TaskSpec
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import Action, Observation, State, StepResult

__all__ = ["MuxClient", "MuxSession", "V2Unsupported"]


class V2Unsupported(ConnectionFailedError):
    """The server answered, but only with protocol v1 (one session per connection)."""


class MuxClient(ClientCore[ActT, ObsT, StateT]):
    """Many sessions on one connection; steps of many sessions in one frame.

    Subclass it with your models as generic arguments, or pass them in:

    >>> from openenv import MuxClient
    >>> from echo_env.models import EchoAction, EchoObservation
    >>> async def play(url: str) -> list[float | None]:
    ...     async with MuxClient(url, action_cls=EchoAction,
    ...                          observation_cls=EchoObservation) as mux:
    ...         envs = await mux.open(64)                # 64 sessions, 64 slots
    ...         await mux.reset(envs, seed=range(64))
    ...         actions = [EchoAction(message=str(i)) for i in range(64)]
    ...         results = await mux.step(envs, actions)  # one frame each way
    ...         return [r.reward for r in results]

    Each session is also a client of its own (``MuxSession``: ``reset``,
    ``step``, ``state``, tools), and calls that many coroutines make at the
    same moment share a frame. One session's error (a bad action, a crashing
    environment) is raised for that session only; the others go on.

    Args:
        base_url: The server (``http://host:port`` or ``ws://.../ws``).
        message_timeout: Seconds to wait for a reply (``None``: forever).
        api_key: Sent as a Bearer token (default: ``$OPENENV_API_KEY``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        action_cls: type[Action] | None = None,
        observation_cls: type[Observation] | None = None,
        state_cls: type[State] | None = None,
        connect_timeout: float = 10.0,
        message_timeout: float | None = 60.0,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        max_size: int | None = 2**26,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if action_cls is not None:
            self.action_cls = action_cls
        if observation_cls is not None:
            self.observation_cls = observation_cls
        elif type(self).observation_cls is Observation:
            self.observation_cls = AnyObservation
        if state_cls is not None:
            self.state_cls = state_cls
        if not isinstance(base_url, str) or "," in base_url:  # a ServerPool, or a pool's URLs
            raise ValueError(
                f"MuxClient holds one connection to one server, not a pool ({base_url!r}); "
                f"open a MuxClient per server, or let Runners place sessions on a ServerPool"
            )
        self.url = ws_url(base_url)
        self.connect_timeout = connect_timeout
        self.message_timeout = message_timeout
        extra_headers = handshake_headers(headers, api_key)
        self._options: dict[str, Any] = {
            "subprotocols": [protocol_v2.SUBPROTOCOL],
            "ping_interval": ping_interval,
            "ping_timeout": ping_timeout,
            "max_size": max_size,
            "open_timeout": connect_timeout,
            "close_timeout": 5,
            "compression": None,
            **({"additional_headers": extra_headers} if extra_headers else {}),
        }
        self._wire: MuxWire | None = None
        self._keys = itertools.count()
        self.sessions = OpenSessions()  # weakly: see open_sessions.py
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        self._connecting = asyncio.Lock()
        # Cuts the connection if this client is garbage-collected unclosed: the
        # server then frees every session's slot, as for a v1 client.
        self._on_drop: weakref.finalize[Any, Any] | None = None

    # -- connection -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Closed, or lost (the connection dropped): no session of it can be used."""
        return self._closed or (self._wire is not None and self._wire.lost is not None)

    async def connect(self) -> Self:
        """Open the connection (no session yet: ``open`` makes them)."""
        async with self._connecting:  # many coroutines may open at once: one socket
            if self._wire is not None:
                return self
            if self._closed:
                raise SessionClosedError("this client was closed; create a new one")
            ws = await open_socket(self.url, self.connect_timeout, self._options)
            if self._closed:  # close() came while the handshake ran: nobody will use it
                await ws.close()
                raise SessionClosedError("this client was closed; create a new one")
            if ws.subprotocol != protocol_v2.SUBPROTOCOL:
                await ws.close()
                raise V2Unsupported(
                    self.url, "the server does not speak openenv's protocol v2 (many sessions)"
                )
            self._wire = MuxWire(ws, self.sessions)
            self._on_drop = close_when_dropped(self, ws.transport, asyncio.get_running_loop())
            return self

    async def open(self, n: int = 1) -> list[MuxSession]:
        """Open ``n`` sessions, each with its own environment and slot, in one frame.

        Raises the server's refusal (``CapacityError``, ``FactoryError``) if
        any could not open; those that did are closed again.
        """
        if operator.index(n) < 0:  # else range() would make it an empty batch, silently
            raise ValueError(f"n (the number of sessions to open) must be 0 or more, got {n}")
        await self.connect()
        sessions = [MuxSession(self, next(self._keys)) for _ in range(n)]
        try:
            replies = await self._call_many([(s, "open", None) for s in sessions], True)
        except BaseException:
            # Given up (a timeout, a cancel) with some open already: nobody holds
            # them to close, so they are closed here (those still opening, once
            # their ``opened`` comes).
            self._abandon([s for s in sessions if s.key in self.sessions])
            raise
        failure = next((r for r in replies if isinstance(r, BaseException)), None)
        if failure is not None:
            await self.close_sessions([s for s in sessions if s.key in self.sessions])
            raise failure
        return sessions

    async def close(self) -> None:
        """Close every session and the connection (their slots are freed).

        Returns once the server has closed the sessions (every caller, however
        many close at once: the first to call does the closing), or after
        ``connect_timeout`` as a v1 client's ``close`` does: a session whose call
        still runs (its close waits behind it) is closed by the server when
        that call ends, and what still waits on it raises ``SessionClosedError``.
        """
        if self._closing is None:
            self._closed = True
            self._closing = asyncio.ensure_future(self._close())
        # Every caller waits for the same closing, and one that is cancelled
        # does not cut it short for the others.
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        wire = self._wire
        if wire is None:
            return
        if self._on_drop is not None:
            self._on_drop.detach()
        if wire.loop is not asyncio.get_running_loop():
            if not abandoned(wire.loop):  # running in another thread: closed there
                home = asyncio.run_coroutine_threadsafe(self._close_wire(wire), wire.loop)
                return await asyncio.wrap_future(home)
            # Nothing runs its loop to close it there (an asyncio.run that returned).
            cut(wire.ws.transport, wire.loop)
            for session in self.sessions.values():
                session.closed = True
            self.sessions.clear()
            return
        await self._close_wire(wire)

    async def _close_wire(self, wire: MuxWire) -> None:
        deadline = deadline_in(self.connect_timeout)  # one limit for all of closing
        try:
            if self.sessions and wire.lost is None:
                # Those dropped unclosed too: their slots are held all the same.
                open_ = [s or MuxSession(self, key) for key, s in self.sessions.items()]
                async with asyncio.timeout_at(deadline):
                    await self.close_sessions(open_)
        except (SessionClosedError, TimeoutError):  # EnvTimeoutError included
            pass
        finally:
            await close_by(wire.ws, deadline)
            await asyncio.wait([wire.reader])

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- batches ----------------------------------------------------------------

    async def reset(
        self,
        sessions: Sequence[MuxSession],
        *,
        seed: int | Iterable[int | None] | None = None,
        episode_id: str | None = None,
        **kwargs: Any,
    ) -> list[StepResult[ObsT]]:
        """Reset every session in one frame; ``seed`` is one per session (or one for all)."""
        if isinstance(seed, Iterable):
            seeds: list[int | None] = list(seed)
            if len(seeds) != len(sessions):
                raise ValueError(f"{len(seeds)} seeds for {len(sessions)} sessions")
        else:  # one for all: an int, numpy's included
            seeds = [None if seed is None else operator.index(seed)] * len(sessions)
        calls: list[tuple[MuxSession, Kind, dict[str, Any] | None]] = [
            (s, "reset", self.encode_reset(sd, episode_id, kwargs))
            for s, sd in zip(sessions, seeds, strict=True)
        ]
        replies = await self._call_many(calls, False)
        return [self.decode_result(r) for r in replies]  # type: ignore[arg-type]

    async def step(
        self,
        sessions: Sequence[MuxSession],
        actions: Sequence[ActT | dict[str, Any]],
        *,
        return_exceptions: bool = False,
    ) -> list[StepResult[ObsT]] | list[StepResult[ObsT] | Exception]:
        """Step every session with its action in one frame; results in order.

        One session's error is raised once all have answered (the first one,
        as ``asyncio.gather`` would), or, with ``return_exceptions=True``,
        returned in its place while the others' results stand.
        """
        if len(actions) != len(sessions):
            raise ValueError(f"{len(actions)} actions for {len(sessions)} sessions")
        calls: list[tuple[MuxSession, Kind, dict[str, Any] | None]] = [
            (s, "step", self.encode_action(a)) for s, a in zip(sessions, actions, strict=True)
        ]
        replies = await self._call_many(calls, return_exceptions)
        results: list[StepResult[ObsT] | Exception] = []
        for reply in replies:
            if isinstance(reply, Exception):
                results.append(reply)
                continue
            try:
                results.append(self.decode_result(reply))  # type: ignore[arg-type]
            except Exception as exc:
                if not return_exceptions:
                    raise
                results.append(exc)
        return results

    def _abandon(self, sessions: Sequence[MuxSession]) -> None:
        """Close these without waiting for the server's word (their caller is gone)."""
        for session in sessions:
            session.closed = True
            self.sessions.pop(session.key, None)
            if self._wire is not None:
                self._wire.close_unheard(session.key)

    async def close_sessions(self, sessions: Sequence[MuxSession]) -> None:
        """Close these sessions (their slots are freed); the connection stays open."""
        live = [s for s in sessions if not s.closed]
        if live:
            await self._call_many([(s, "close", None) for s in live], True)
        for session in live:
            session.closed = True
            self.sessions.pop(session.key, None)

    # -- requests ---------------------------------------------------------------

    async def _call_many(
        self,
        calls: Sequence[tuple[MuxSession, Kind, dict[str, Any] | None]],
        return_exceptions: bool,
    ) -> list[dict[str, Any] | BaseException]:
        if not calls:  # a batch of no sessions (every episode done, say): nothing to ask
            return []
        # Keys are per connection: another client's session 0 would be this one's.
        stranger = next((s for s, _, _ in calls if s.mux is not self), None)
        if stranger is not None:
            raise ValueError(f"{stranger!r} belongs to another MuxClient ({stranger.url})")
        futures = [self._queue(session, kind, data) for session, kind, data in calls]
        try:
            async with asyncio.timeout(self.message_timeout):
                await asyncio.wait(futures)
        except asyncio.CancelledError:  # nobody will read them: a late failure stays silent
            self._forget(futures)
            raise
        except TimeoutError:
            self._forget(futures)
            raise EnvTimeoutError(
                f"no reply to {len(calls)} requests within {self.message_timeout}s "
                f"from {shown_url(self.url)}"
            ) from None
        # Every error is retrieved, the first raised: asyncio would log the
        # others as "never retrieved", one ERROR for each failing session.
        replies: list[dict[str, Any] | BaseException] = [
            future.exception() or future.result() for future in futures
        ]
        if not return_exceptions:
            failure = next((r for r in replies if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
        return replies

    async def _call(
        self, session: MuxSession, kind: Kind, data: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        future = self._queue(session, kind, data)
        started = time.time() if session.on_exchange is not None else 0.0
        try:
            async with asyncio.timeout(self.message_timeout):
                reply = await future
        except asyncio.CancelledError:
            self._forget([future])
            raise
        except TimeoutError:
            self._forget([future])
            raise EnvTimeoutError(
                f"no reply to {kind!r} within {self.message_timeout}s from {shown_url(self.url)}"
            ) from None
        if session.on_exchange is not None:  # recorded as the v1 frames they stand for
            frame = protocol.request_frame(kind, data)  # type: ignore[arg-type]
            session.on_exchange(frame, orjson.dumps(reply).decode(), started)
        return reply

    def _queue(
        self, session: MuxSession, kind: Kind, data: dict[str, Any] | None
    ) -> asyncio.Future[dict[str, Any]]:
        wire = self._wire
        if wire is None:  # never connected: no session of it can have opened
            raise SessionClosedError("this client is not connected")
        if self._closed and kind != "close":  # else the connection's own end would be told
            raise SessionClosedError("this client was closed; create a new one")
        if wire.loop is not asyncio.get_running_loop():
            if abandoned(wire.loop):
                raise SessionClosedError(
                    "this client's connection was opened on an event loop that has stopped; "
                    "create a new client"
                )
            raise RuntimeError("a MuxClient is used on the event loop that opened its connection")
        return wire.queue(session, kind, data)

    def _forget(self, futures: Sequence[asyncio.Future[dict[str, Any]]]) -> None:
        if self._wire is not None:
            self._wire.forget(futures)


class MuxSession:
    """One session of a ``MuxClient``: the calls of ``EnvClient``, on a shared connection."""

    __slots__ = (
        "__weakref__",
        "closed",
        "closed_because",
        "key",
        "mux",
        "on_close",
        "on_exchange",
        "session_id",
    )

    def __init__(self, mux: MuxClient[Any, Any, Any], key: protocol_v2.SessionKey) -> None:
        self.mux = mux
        self.key = key
        self.session_id = ""  # the server's id for it (as in its logs), once open
        self.closed = False
        self.closed_because = "the session is closed"
        # Told of every exchange, as v1 frames: (request, reply, time.time() sent).
        self.on_exchange: Callable[[str, str | bytes, float], None] | None = None
        # Called once, when ``close()`` is: e.g. a ServerPool counting its slots.
        self.on_close: Callable[[], None] | None = None

    @property
    def url(self) -> str:
        return self.mux.url

    @property
    def action_cls(self) -> type[Action]:
        return self.mux.action_cls

    async def connect(self) -> MuxSession:
        """Open already (``MuxClient.open`` opened it); here for the clients' common shape."""
        return self

    async def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> StepResult[Any]:
        mux = self.mux
        reply = await mux._call(self, "reset", mux.encode_reset(seed, episode_id, kwargs))
        return mux.decode_result(reply)

    async def step(self, action: Action | dict[str, Any]) -> StepResult[Any]:
        mux = self.mux
        return mux.decode_result(await mux._call(self, "step", mux.encode_action(action)))

    async def state(self) -> State:
        return self.mux.decode_state(await self.mux._call(self, "state"))  # type: ignore[no-any-return]

    async def list_tools(self) -> list[ToolInfo]:
        return self.mux.decode_tools(await self.mux._call(self, "list_tools"))

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any] | BaseModel | None = None, **kwargs: Any
    ) -> ToolOutput:
        data = self.mux.encode_tool_call(name, arguments, kwargs)
        return self.mux.decode_tool_result(await self.mux._call(self, "call_tool", data))

    async def get_prompt(self, task: TaskSpec | None = None) -> str:
        data = {"task": task.model_dump(mode="json")} if task is not None else {}
        return self.mux.decode_prompt(await self.mux._call(self, "get_prompt", data))

    async def close(self) -> None:
        """Close this session (its slot is freed); the connection stays open."""
        try:
            await self.mux.close_sessions([self])
        finally:
            on_close, self.on_close = self.on_close, None
            if on_close is not None:
                on_close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<MuxSession {self.key!r} {self.session_id or '(opening)'} {state}>"
