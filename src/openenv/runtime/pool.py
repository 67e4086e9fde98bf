"""Open sessions kept between the episodes of one batch.

A session that ended its episode cleanly is handed to the next task for the
same environment, which starts with ``reset``: no new handshake, no new
environment instance. A session that saw any failure is closed instead, in
the background: its episode's result does not wait for a server that stopped
answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

from openenv.client import MuxClient, MuxSession, ServerPool, V2Unsupported, WebSocketEnvClient
from openenv.client.pool import as_pool
from openenv.errors import CapacityError, ConnectionFailedError, SessionClosedError, SessionError
from openenv.runtime.inprocess import InProcessClient
from openenv.runtime.session import SessionClient
from openenv.runtime.task import Task
from openenv.types import Action

__all__ = ["ClientPool", "Multiplexer"]

_CLOSE_TIMEOUT = 5.0
# A thread pool starts a thread only when none is idle, so its threads number
# the calls in flight (at most an episode's worth each), plus any left running
# past their task's timeout: Python cannot stop those, and with a bound near
# the episodes in flight later calls would queue behind them. So the bound is
# far past that, only a guard against runaway.
_MAX_THREADS = 4096
# Servers a new session may fail to reach before the error is the episode's.
_PLACE_ATTEMPTS = 8


class ClientPool:
    """Sessions for the tasks of one batch, reused across episodes; close with ``aclose``."""

    def __init__(self, max_idle: int, *, multiplex: bool = True) -> None:
        self.max_idle = max_idle
        self.multiplex = multiplex
        # One per server (and key): its sessions share a few connections (protocol v2).
        self._muxes: dict[tuple[str, str | None], Multiplexer] = {}
        self._idle: defaultdict[Hashable, list[SessionClient]] = defaultdict(list)
        self._closing: defaultdict[Hashable, set[asyncio.Task[None]]] = defaultdict(set)
        self._executor: ThreadPoolExecutor | None = None
        self._threads: ThreadPoolExecutor | None = None

    @property
    def threads(self) -> ThreadPoolExecutor:
        """Threads for agents' sync ``act()``, made as they are needed."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(_MAX_THREADS, thread_name_prefix="openenv-agent")
        return self._threads

    async def acquire(self, task: Task, *, fresh: bool = False) -> tuple[SessionClient, bool]:
        """A connected session for ``task``, and whether it was used before."""
        key = _key(task)
        idle = self._idle.get(key)
        if idle and not fresh:
            return idle.pop(), True
        closing = self._closing.get(key)
        if closing:
            # A session still being closed may hold the server's last free slot:
            # the new one opens after it (as it did when release waited for the close).
            await asyncio.wait(closing)
        if self.multiplex and task.client_cls is None:
            session = None
            pool = _pool_of(task)
            if pool is not None:
                session = await self._placed(pool)
            elif isinstance(task.env, str):
                session = await self._multiplexer(task.env).open()
            if session is not None:
                return session, False
            # else: the server speaks only v1
        client = self._new(task)
        try:
            await client.connect()
        except BaseException:
            self._close_later(key, client)
            raise
        return client, False

    def _multiplexer(self, url: str, api_key: str | None = None) -> Multiplexer:
        mux = self._muxes.get((url, api_key))
        if mux is None:
            mux = self._muxes[url, api_key] = Multiplexer(url, api_key=api_key)
        return mux

    async def _placed(self, pool: ServerPool) -> MuxSession | None:
        """A v2 session on the server the pool chooses; as ``EnvClient`` places one:
        a full server is skipped until ``pool.wait`` runs out, a dead one too."""
        deadline = time.monotonic() + pool.wait
        lost = 0
        while True:
            url = await pool.place()
            try:
                session = await self._multiplexer(url, pool.api_key).open()
            except CapacityError:
                pool.refused(url)
                if time.monotonic() > deadline:
                    raise
                continue
            except (ConnectionFailedError, SessionClosedError, SessionError) as exc:
                if isinstance(exc, SessionError) and not exc.details.get("draining"):
                    pool.ended(url)  # no session after all
                    raise
                pool.failed(url)  # gone, or shutting down: the next server
                lost += 1
                if lost >= _PLACE_ATTEMPTS:
                    raise
                continue
            except BaseException:  # no session after all (its factory failed, a timeout)
                pool.ended(url)
                raise
            if session is None:  # a v1 server: EnvClient places its own session
                pool.ended(url)
                return None
            session.on_close = functools.partial(pool.ended, url)
            return session

    def release(self, task: Task, client: SessionClient, *, reusable: bool) -> None:
        """Keep a session for the next task, or close it in the background.

        Never waits: closing a session on a server that stopped answering
        takes up to ``_CLOSE_TIMEOUT``, and the episode's result (its
        timeout, say) must not wait for that. ``aclose`` waits for it.
        """
        key = _key(task)
        idle = self._idle[key]
        # An idle session holds a server slot: while sessions wait for room in
        # the task's ServerPool, hand the slot over instead of keeping it.
        pool = _pool_of(task)
        crowded = pool is not None and pool.waiting > 0
        if reusable and len(idle) < self.max_idle and not crowded:
            idle.append(client)
        else:
            self._close_later(key, client)

    def _close_later(self, key: Hashable, client: SessionClient) -> None:
        closing = self._closing[key]
        job = asyncio.create_task(_close(client))
        closing.add(job)
        job.add_done_callback(closing.discard)

    async def aclose(self) -> None:
        for key, idle in self._idle.items():
            for client in idle:
                self._close_later(key, client)
        self._idle.clear()
        while closing := {job for jobs in self._closing.values() for job in jobs}:
            await asyncio.wait(closing)
        muxes, self._muxes = list(self._muxes.values()), {}
        await asyncio.gather(*(m.aclose() for m in muxes))
        if self._executor is not None:
            # A `def` environment method stuck past its task's timeout keeps its
            # thread; the run does not wait for it.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._threads is not None:  # likewise a blocking act() past its timeout
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None

    def _new(self, task: Task) -> SessionClient:
        if task.env is None:
            return NoEnvironment()
        if isinstance(task.env, str | ServerPool):
            return (task.client_cls or WebSocketEnvClient)(task.env)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                _MAX_THREADS, thread_name_prefix="openenv-inprocess"
            )
        return InProcessClient(task.env, self._executor)


class Multiplexer:
    """The sessions of one server over a few shared v2 connections.

    Each connection carries up to ``per_connection`` sessions; their requests,
    made by many episodes at once, share frames. A server that speaks only v1
    is remembered, and its sessions get a connection each.
    """

    def __init__(self, url: str, per_connection: int = 256, api_key: str | None = None) -> None:
        self.url = url
        self.per_connection = per_connection
        self.api_key = api_key  # None: $OPENENV_API_KEY, as any client
        self.v1_only = False
        self._clients: list[MuxClient[Any, Any, Any]] = []
        self._connecting: asyncio.Lock = asyncio.Lock()

    async def open(self) -> MuxSession | None:
        """A new session (``None``: the server speaks only v1; use a client of its own)."""
        if self.v1_only:
            return None
        client = await self._client()
        if client is None:
            return None
        (session,) = await client.open(1)
        return session

    async def _client(self) -> MuxClient[Any, Any, Any] | None:
        self._clients = [c for c in self._clients if not c.closed]
        for client in self._clients:
            if len(client.sessions) < self.per_connection:
                return client
        async with self._connecting:
            # Another episode may have connected while this one waited.
            for client in self._clients:
                if not client.closed and len(client.sessions) < self.per_connection:
                    return client
            if self.v1_only:
                return None
            client = MuxClient(self.url, api_key=self.api_key)
            try:
                await client.connect()
            except V2Unsupported:
                self.v1_only = True
                return None
            self._clients.append(client)
            return client

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        await asyncio.gather(*(_close(c) for c in clients))


class NoEnvironment:
    """The session of a task with no ``env``: any use of it says so."""

    url = "none"
    action_cls = Action

    async def connect(self) -> NoEnvironment:
        return self

    async def reset(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse()

    async def step(self, action: Any) -> Any:
        self._refuse()

    async def state(self) -> Any:
        self._refuse()

    async def close(self) -> None:
        pass

    def _refuse(self) -> NoReturn:
        raise TypeError(
            "this task has no environment: give it one (Task(env=url or factory)), "
            "or let its agent use only session.input"
        )


def _pool_of(task: Task) -> ServerPool | None:
    """The pool the task's sessions are placed by: its ``ServerPool``, or the one
    (shared in this process) its URLs joined by commas stand for."""
    return as_pool(task.env) if isinstance(task.env, str | ServerPool) else None


def _key(task: Task) -> Hashable:
    env = task.env if isinstance(task.env, str | ServerPool) else id(task.env)
    return (env, task.client_cls)


async def _close(client: SessionClient | MuxClient[Any, Any, Any]) -> None:
    # A failed session may be half-dead; closing it must neither raise nor hang.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_CLOSE_TIMEOUT):
            await client.close()
