"""``EpisodeSession``: the environment session an agent drives for one task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
import warnings
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

from openenv.client import http_url
from openenv.client._base import auth_headers
from openenv.json_schema import model_schema
from openenv.runtime.recording import EpisodeRecord, ended_by
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import Action, State, StepResult

if TYPE_CHECKING:
    from openenv.runtime.pool import ClientPool
    from openenv.runtime.task import Task, TaskResult

__all__ = ["EpisodeSession", "SessionClient", "fetch_schema"]


class SessionClient(Protocol):
    """What an episode needs of a client: a remote ``EnvClient`` or an in-process one."""

    @property
    def url(self) -> str: ...
    @property
    def action_cls(self) -> type[Action]: ...

    async def connect(self) -> Any: ...
    async def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> StepResult[Any]: ...
    async def step(self, action: Any) -> StepResult[Any]: ...
    async def state(self) -> State: ...
    async def close(self) -> None: ...


class EpisodeSession:
    """One task's view of its environment: ``reset``, ``step``, ``state``, and bookkeeping.

    ``reset()`` with no arguments uses the task's ``seed``, ``episode_id`` and
    ``reset_kwargs``. Every ``step`` is counted and its reward added up; the
    runtime reports both in the task's result.

    Attributes:
        task: The task being played.
        previous: The previous task's result when the run is
            ``sequence_dependent`` (``None`` for the first task, and otherwise).
        steps: Steps taken so far.
        total_reward: Sum of the rewards so far (of steps and tools), as
            ``EnvSession.total_reward`` keeps it.

    >>> from openenv.runtime import Runners, Task
    >>> from echo_env.server.environment import EchoEnvironment
    >>> async def peek(session):
    ...     await session.reset()
    ...     await session.step({"message": "hey"})
    ...     return session.steps, session.total_reward, (await session.state()).step_count
    >>> Runners.sync_run_task([Task(id="t0", env=EchoEnvironment, agent=peek)])[0].value
    (1, 0.3, 1)
    """

    def __init__(
        self,
        task: Task,
        client: SessionClient,
        previous: TaskResult | None,
        pool: ClientPool | None = None,
        record: EpisodeRecord | None = None,
    ) -> None:
        self.task = task
        self.client = client
        self.previous = previous
        self.record = record
        self._pool = pool
        if hasattr(client, "on_exchange"):  # a client kept for reuse may still tell another
            client.on_exchange = None if record is None else record.call
        self.steps = 0
        self.total_reward = 0.0
        self.requests = 0  # answered requests; 0 means the session was never used

    @property
    def reward(self) -> float:
        """Deprecated name of ``total_reward``; it goes in the next release."""
        warnings.warn(
            "EpisodeSession.reward is now total_reward (as EnvSession spells it); "
            "the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.total_reward

    @property
    def max_steps(self) -> int | None:
        return self.task.max_steps

    @property
    def threads(self) -> Executor | None:
        """Where a sync ``act()`` runs (``None``: the loop's default executor)."""
        return self._pool.threads if self._pool is not None else None

    @contextlib.asynccontextmanager
    async def fork(self) -> AsyncIterator[EpisodeSession]:
        """Another session of the same task's environment, for another episode at once.

        Its steps and reward count in this task's result; it is closed (or
        kept for reuse, if it ended cleanly) when the block ends.
        """
        if self._pool is None:
            raise RuntimeError("this session was not opened by the runtime; it cannot fork")
        # Numbered as forked, not as their sessions open (in any order, in threads
        # for an in-process environment): fork-1 is the first sub-agent's.
        record = self.record.fork() if self.record is not None else None
        client, _ = await self._pool.acquire(self.task, fresh=True)
        own = EpisodeSession(self.task, client, self.previous, self._pool, record)
        reason = "ok"
        try:
            yield own
        except BaseException as exc:
            reason = ended_by(exc)
            raise
        finally:
            self.steps += own.steps
            self.total_reward += own.total_reward
            self.requests += own.requests
            if record is not None:
                record.close(reason)
            self._pool.release(self.task, client, reusable=reason == "ok")

    @property
    def input(self) -> Any:
        """The task's ``input`` (AWorld's ``Task(input=...)``), or ``None``.

        In a ``sequence_dependent`` run a task without an input of its own gets
        the previous task's, as AWorld chains them: its answer, or why it
        failed. Only the task's own input is passed to ``reset``.
        """
        if self.task.input is None and self.previous is not None:
            return self.previous.answer if self.previous.ok else self.previous.msg
        return self.task.input

    async def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> StepResult[Any]:
        """Start the episode; arguments left out come from the task."""
        options = {**_input_kwargs(self.task.input), **self.task.reset_kwargs, **kwargs}
        # A mapping input (a dataset row) or reset_kwargs may name the seed or
        # the episode id too: each goes once, the task's own field first.
        named_seed, named_id = options.pop("seed", None), options.pop("episode_id", None)
        result = await self.client.reset(
            seed=_first(seed, self.task.seed, named_seed),
            episode_id=_first(episode_id, self.task.episode_id, named_id),
            **options,
        )
        self.requests += 1
        return result

    async def step(self, action: Any) -> StepResult[Any]:
        """Apply an action (a model or a dict of its fields)."""
        result = await self.client.step(action)
        self.requests += 1
        self.steps += 1
        if result.reward is not None:
            self.total_reward += result.reward
        return result

    async def state(self) -> State:
        """The environment's current state."""
        state = await self.client.state()
        self.requests += 1
        return state

    async def list_tools(self) -> list[ToolInfo]:
        """The environment's tools (names, descriptions, argument schemas)."""
        tools: list[ToolInfo] = await self._tool_client("list_tools").list_tools()
        self.requests += 1
        return tools

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> ToolOutput:
        """Call one of the environment's tools: ``call_tool("submit", answer=3)``.

        Its reward (``output.reward``) counts in the task's result like a step's.
        """
        output: ToolOutput = await self._tool_client("call_tool").call_tool(
            name, arguments, **kwargs
        )
        self.requests += 1
        if output.reward is not None:
            self.total_reward += output.reward
        return output

    async def get_prompt(self) -> str:
        """The prompt of the task the episode was reset with."""
        prompt: str = await self._tool_client("get_prompt").get_prompt()
        self.requests += 1
        return prompt

    def _tool_client(self, method: str) -> Any:
        if not callable(getattr(self.client, method, None)):
            raise TypeError(
                f"this task's client ({type(self.client).__name__}) has no {method}(); "
                f"tools need an environment with @tool methods, served or in process"
            )
        return self.client

    async def action_schema(self) -> dict[str, Any]:
        """The JSON Schema of the environment's action (from ``GET /schema`` when remote)."""
        if self.client.action_cls is not Action:
            return model_schema(self.client.action_cls)
        return await fetch_schema(self.client.url)


def _input_kwargs(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _first(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)


_schemas: dict[str, dict[str, Any]] = {}


async def fetch_schema(url: str) -> dict[str, Any]:
    """The action schema a server publishes; fetched once per server and process."""
    root = http_url(url)
    if root not in _schemas:
        _schemas[root] = await asyncio.to_thread(_get_action_schema, f"{root}/schema")
    return _schemas[root]


def _get_action_schema(url: str) -> dict[str, Any]:
    # With the key the session's own client sends ($OPENENV_API_KEY): /schema needs it too.
    request = urllib.request.Request(url, headers=auth_headers())
    with urllib.request.urlopen(request, timeout=10) as response:
        schema: dict[str, Any] = json.load(response)["action"]
    return schema
