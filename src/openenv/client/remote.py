"""Environments on a server, as agent platforms expose them: tasks, then sessions.

``MultiEnvClient(url).environments.get(name)`` (a multi-environment server) or
``RemoteEnv(url)`` (a server of one environment) lists splits and tasks over
HTTP and opens sessions over WebSocket. ``session(task)`` is an async
context manager: it connects, resets with the task, and closes at exit.

Opening many sessions at once is safe: handshakes go through a bounded gate,
and a server at capacity is retried with backoff until a slot frees up.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel

from openenv import protocol
from openenv.client._base import AnyObservation, http_url, url_key
from openenv.client.async_ import WebSocketEnvClient
from openenv.client.pool import ServerPool, as_pool
from openenv.client.remote_http import Doc, get_document, http_client, http_headers
from openenv.errors import (
    CapacityError,
    ConnectionFailedError,
    NotFoundError,
    OpenEnvError,
    SessionClosedError,
)
from openenv.tasks import TaskSpec
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import Action, Observation, State, StepResult

if TYPE_CHECKING:
    from openenv.client.remote_sync import SyncEnvSession, SyncMultiEnvClient, SyncRemoteEnv

__all__ = ["EnvSession", "Environments", "MultiEnvClient", "RemoteEnv"]

_PAGE = 1000  # the server's largest page


class ConnectGate:
    """A semaphore that re-binds to whichever event loop uses it.

    ``asyncio.Semaphore`` belongs to the loop it first waits on; a client may
    be driven from several (``asyncio.run`` twice, or the sync wrapper).
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_connecting must be at least 1, got {limit}")
        self.limit = limit
        self._semaphores: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            self._semaphores = {lp: s for lp, s in self._semaphores.items() if not lp.is_closed()}
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.limit)
        return semaphore


class MultiEnvClient:
    """A server that hosts several environments (``create_multi_app``).

    >>> client = MultiEnvClient("http://localhost:8000")
    >>> client.environments.get("counter").url
    'http://localhost:8000/envs/counter'

    Args:
        base_url: The server's root, ``http(s)://host:port``.
        max_connecting: Sessions that may be opening (handshake and reset) at
            once, across all of this client's environments.
        capacity_timeout: Seconds a session keeps retrying a server at
            capacity before the ``CapacityError`` is raised (``0``: never retry).
        **options: Connection options for every session (``message_timeout``, ...).
    """

    def __init__(
        self,
        base_url: str,
        *,
        max_connecting: int = 64,
        capacity_timeout: float = 600.0,
        **options: Any,
    ) -> None:
        self.url = http_url(base_url)
        self.gate = ConnectGate(max_connecting)
        self.capacity_timeout = capacity_timeout
        in_url = url_key(base_url)  # a ?api_key=, which self.url drops
        self.options = {"api_key": in_url, **options} if in_url else options
        self.headers = http_headers(self.options)
        self.environments = Environments(self)

    def sync(self) -> SyncMultiEnvClient:
        """A blocking twin with the same methods."""
        from openenv.client.remote_sync import SyncMultiEnvClient

        return SyncMultiEnvClient(self)


class Environments:
    """The environments of an ``MultiEnvClient``'s server."""

    def __init__(self, client: MultiEnvClient) -> None:
        self._client = client

    def get(
        self,
        name: str,
        *,
        action_cls: type[Action] = Action,
        observation_cls: type[Observation] = AnyObservation,
        state_cls: type[State] = State,
        task_cls: type[TaskSpec] = TaskSpec,
    ) -> RemoteEnv:
        """The environment served at ``/envs/{name}``; no request is made yet."""
        client = self._client
        env = RemoteEnv(
            f"{client.url}/envs/{name.strip('/')}",
            action_cls=action_cls,
            observation_cls=observation_cls,
            state_cls=state_cls,
            task_cls=task_cls,
            gate=client.gate,
            capacity_timeout=client.capacity_timeout,
            **client.options,
        )
        env.listed_at = (f"{client.url}/envs", name.strip("/"))
        return env

    async def list(self) -> list[protocol.EnvInfo]:
        """Every environment on the server, with its sessions, splits and tools."""
        url = f"{self._client.url}/envs"
        return (await get_document(url, protocol.EnvListing, headers=self._client.headers)).envs


class RemoteEnv:
    """One environment on a server: its tools, splits and tasks, and sessions with it.

    >>> env = RemoteEnv("http://localhost:8000")
    >>> env.url
    'http://localhost:8000'

    Args:
        base_url: Where the environment's routes live: the server root for a
            one-environment server, ``.../envs/{name}`` on a multi-environment one;
            or a ``ServerPool`` of servers of this environment (sessions go where
            there is room; splits, tasks and tools are read from its first server
            that answers).
        action_cls / observation_cls / state_cls: Models replies are parsed into.
        task_cls: The environment's ``TaskSpec`` subclass, for typed tasks.
        max_connecting: Sessions that may be opening at once (ignored with ``gate``).
        capacity_timeout: Seconds to keep retrying a server at capacity.
        gate: A gate shared with other environments (``MultiEnvClient`` passes its own).
        **options: Connection options of ``EnvClient`` (``message_timeout``, ...).
    """

    def __init__(
        self,
        base_url: str | ServerPool,
        *,
        action_cls: type[Action] = Action,
        observation_cls: type[Observation] = AnyObservation,
        state_cls: type[State] = State,
        task_cls: type[TaskSpec] = TaskSpec,
        max_connecting: int = 64,
        capacity_timeout: float = 600.0,
        gate: ConnectGate | None = None,
        **options: Any,
    ) -> None:
        self.pool = base_url if isinstance(base_url, ServerPool) else as_pool(base_url)
        self.url = http_url(self.pool.urls[0] if self.pool is not None else str(base_url))
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.state_cls = state_cls
        self.task_cls = task_cls
        self.gate = gate or ConnectGate(max_connecting)
        self.capacity_timeout = capacity_timeout
        # The key of a URL's ?api_key=, which self.url drops, goes to sessions as an option.
        in_url = url_key(base_url) if isinstance(base_url, str) and self.pool is None else None
        self.options = {"api_key": in_url, **options} if in_url else options
        # Sessions send the key on their handshake; HTTP calls send it here
        # (a pool's key, as its sessions do, unless given one of its own).
        key = self.options.get("api_key") or (self.pool.api_key if self.pool is not None else None)
        self.headers = http_headers({**options, "api_key": key})
        # On a multi-environment server: its listing and this environment's name.
        self.listed_at: tuple[str, str] | None = None

    async def _unknown(self) -> NotFoundError | None:
        """``NotFoundError`` if the server's listing lacks this environment's name."""
        if self.listed_at is None:
            return None
        listing_url, name = self.listed_at
        try:
            listing = await get_document(listing_url, protocol.EnvListing, headers=self.headers)
        except OpenEnvError:
            return None  # the original error says more than this one would
        names = sorted(env.name for env in listing.envs)
        if name in names:
            return None
        return NotFoundError(
            self.url, 404, f"no environment named {name!r}; this server has {', '.join(names)}"
        )

    async def _read(
        self,
        path: str,
        model: type[Doc],
        params: Mapping[str, Any] | None = None,
        http: Any = None,
    ) -> Doc:
        """GET ``path`` as a ``model`` from this environment's server; with a pool, from
        the first of its servers that can be reached (every one serves the same)."""
        roots = [self.url] if self.pool is None else list(self.pool.urls)
        for root in roots[:-1]:
            try:
                return await get_document(
                    f"{root}{path}", model, params, http, headers=self.headers
                )
            except ConnectionFailedError:
                continue
        return await get_document(f"{roots[-1]}{path}", model, params, http, headers=self.headers)

    async def _get(self, path: str, model: type[Doc]) -> Doc:
        try:
            return await self._read(path, model)
        except NotFoundError:
            unknown = await self._unknown()
            if unknown is not None:
                raise unknown from None
            raise

    async def list_splits(self) -> list[str]:
        """The names of the environment's task splits."""
        return (await self._get("/splits", protocol.SplitList)).splits

    async def list_tasks(
        self, split: str, *, offset: int = 0, limit: int | None = None
    ) -> list[TaskSpec]:
        """The tasks of ``split`` from ``offset``: ``limit`` of them, or all that follow.

        Raises:
            NotFoundError: the environment has no such split.
        """
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError(f"offset and limit must not be negative, got {offset}, {limit}")
        if self.listed_at is not None:
            # An unknown environment is named as such.
            await self._get("/splits", protocol.SplitList)
        tasks: list[TaskSpec] = []
        async with http_client(self.headers) as http:
            while limit is None or len(tasks) < limit:
                size = _PAGE if limit is None else min(_PAGE, limit - len(tasks))
                if size == 0:
                    break
                params: dict[str, Any] = {"split": split, "offset": offset, "limit": size}
                page = await self._read("/tasks", protocol.TaskPage, params, http)
                tasks.extend(self.task_cls.model_validate(t.model_dump()) for t in page.tasks)
                if page.next_offset is None:
                    break
                offset = page.next_offset
        return tasks

    async def list_tools(self) -> list[ToolInfo]:
        """The environment's tools, without opening a session."""
        return (await self._get("/tools", protocol.ToolList)).tools

    def session(
        self,
        task: TaskSpec | None = None,
        *,
        split: str | None = None,
        index: int | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        **reset_kwargs: Any,
    ) -> EnvSession:
        """A session reset with ``task``: ``async with env.session(task) as session: ...``.

        ``split="train", index=3`` picks the split's fourth task instead; it is
        fetched when the session opens.
        """
        if (split is None) != (index is None):
            raise ValueError("pass split and index together")
        if task is not None and split is not None:
            raise ValueError("pass a task, or a split and an index, not both")
        if task is not None:
            reset_kwargs["task"] = task
        at = None if split is None or index is None else (split, index)
        return EnvSession(
            self, seed=seed, episode_id=episode_id, reset_kwargs=reset_kwargs, task_at=at
        )

    def sync(self) -> SyncRemoteEnv:
        """A blocking twin with the same methods."""
        from openenv.client.remote_sync import SyncRemoteEnv

        return SyncRemoteEnv(self)

    def _client(self) -> WebSocketEnvClient:
        return WebSocketEnvClient(
            self.pool or self.url,
            action_cls=self.action_cls,
            observation_cls=self.observation_cls,
            state_cls=self.state_cls,
            **self.options,
        )


class EnvSession:
    """One episode's session: tools, prompt, and plain ``reset``/``step``/``state``.

    It keeps score as it goes: ``total_reward`` sums the rewards of every
    step and tool call, ``steps`` counts them, ``done`` says whether the
    episode has ended.
    """

    def __init__(
        self,
        env: RemoteEnv,
        *,
        seed: int | None,
        episode_id: str | None,
        reset_kwargs: Mapping[str, Any],
        task_at: tuple[str, int] | None = None,
    ) -> None:
        self.env = env
        self._task_at = task_at
        task = reset_kwargs.get("task")
        self.task: TaskSpec | None = task if isinstance(task, TaskSpec) else None
        self._reset_args = (seed, episode_id, dict(reset_kwargs))
        self._client: WebSocketEnvClient | None = None
        self.first: StepResult[Observation] | None = None
        self.total_reward = 0.0
        self.steps = 0
        self.done = False

    @property
    def client(self) -> WebSocketEnvClient:
        if self._client is None:
            raise SessionClosedError("the session is not open; use `async with env.session(...)`")
        return self._client

    async def open(self) -> Self:
        """Connect and reset; waits (with backoff) while the server is at capacity."""
        seed, episode_id, kwargs = self._reset_args
        if self._task_at is not None:
            split, index = self._task_at
            found = await self.env.list_tasks(split, offset=index, limit=1)
            if not found:
                raise IndexError(f"split {split!r} has no task at index {index}")
            kwargs["task"] = self.task = found[0]
            self._task_at = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.env.capacity_timeout
        delay = 0.05
        while True:
            client = self.env._client()
            try:
                async with self.env.gate.semaphore():
                    first = await client.reset(seed=seed, episode_id=episode_id, **kwargs)
            except CapacityError:
                await client.close()
                if loop.time() + delay > deadline:
                    raise
            except ConnectionFailedError:
                await client.close()
                unknown = await self.env._unknown()
                if unknown is not None:
                    raise unknown from None
                raise
            except BaseException:
                await client.close()
                raise
            else:
                self._client, self.first = client, first
                self.done = first.done
                return self
            # Jitter spreads retries so freed slots are not stampeded.
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 2.0)

    async def reset(self, **kwargs: Any) -> StepResult[Observation]:
        """Start a new episode in this session (same task unless ``task=`` is given)."""
        if self.task is not None:
            kwargs.setdefault("task", self.task)
        result = await self.client.reset(**kwargs)
        task = kwargs.get("task")
        self.task = task if isinstance(task, TaskSpec) else self.task
        self.total_reward, self.steps, self.done = 0.0, 0, result.done
        return result

    async def step(self, action: Action | dict[str, Any]) -> StepResult[Observation]:
        result = await self.client.step(action)
        self._score(result.reward, result.done)
        return result

    async def state(self) -> State:
        return await self.client.state()

    async def list_tools(self) -> list[ToolInfo]:
        return await self.client.list_tools()

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | BaseModel | None = None,
        **kwargs: Any,
    ) -> ToolOutput:
        """Call a tool; see ``EnvClient.call_tool`` for the errors it raises."""
        output = await self.client.call_tool(name, arguments, **kwargs)
        self._score(output.reward, output.finished)
        return output

    async def get_prompt(self) -> str:
        """The prompt of this session's task."""
        return await self.client.get_prompt()

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def sync(self) -> SyncEnvSession:
        """A blocking twin (open it with ``with``)."""
        from openenv.client.remote_sync import SyncEnvSession

        return SyncEnvSession(self)

    def _score(self, reward: float | None, done: bool) -> None:
        self.steps += 1
        self.total_reward += reward or 0.0
        self.done = self.done or done

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
