"""Blocking twins of ``MultiEnvClient``, ``RemoteEnv`` and ``EnvSession``.

They drive the async objects on the shared background loop of the sync
client, so they work anywhere, a running event loop (a notebook) included.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

from pydantic import BaseModel

from openenv import protocol
from openenv.client.remote import EnvSession, MultiEnvClient, RemoteEnv
from openenv.client.sync import run_sync
from openenv.tasks import TaskSpec
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import Action, Observation, State, StepResult

__all__ = ["SyncEnvSession", "SyncEnvironments", "SyncMultiEnvClient", "SyncRemoteEnv"]


class SyncMultiEnvClient:
    """Blocking twin of ``MultiEnvClient``; also ``MultiEnvClient(url).sync()``.

    >>> SyncMultiEnvClient("http://localhost:8000").environments.get("echo").url
    'http://localhost:8000/envs/echo'
    """

    def __init__(self, client: MultiEnvClient | str, **options: Any) -> None:
        self.client = (
            client if isinstance(client, MultiEnvClient) else MultiEnvClient(client, **options)
        )
        self.environments = SyncEnvironments(self.client)


class SyncEnvironments:
    """The environments of a ``SyncMultiEnvClient``'s server."""

    def __init__(self, client: MultiEnvClient) -> None:
        self._client = client

    def get(self, name: str, **classes: Any) -> SyncRemoteEnv:
        """The environment served at ``/envs/{name}``."""
        return SyncRemoteEnv(self._client.environments.get(name, **classes))

    def list(self) -> list[protocol.EnvInfo]:
        """Every environment on the server."""
        return run_sync(self._client.environments.list())


class SyncRemoteEnv:
    """Blocking twin of ``RemoteEnv``: ``SyncRemoteEnv(url)`` or ``RemoteEnv(url).sync()``."""

    def __init__(self, env: RemoteEnv | str, **options: Any) -> None:
        self.env = env if isinstance(env, RemoteEnv) else RemoteEnv(env, **options)

    @property
    def url(self) -> str:
        return self.env.url

    def list_splits(self) -> list[str]:
        return run_sync(self.env.list_splits())

    def list_tasks(
        self, split: str, *, offset: int = 0, limit: int | None = None
    ) -> list[TaskSpec]:
        return run_sync(self.env.list_tasks(split, offset=offset, limit=limit))

    def list_tools(self) -> list[ToolInfo]:
        return run_sync(self.env.list_tools())

    def session(self, task: TaskSpec | None = None, **reset_kwargs: Any) -> SyncEnvSession:
        """A session reset with ``task`` (or ``split=``, ``index=``): ``with env.session(...)``."""
        return SyncEnvSession(self.env.session(task, **reset_kwargs))


class SyncEnvSession:
    """Blocking twin of ``EnvSession``."""

    def __init__(self, session: EnvSession) -> None:
        self.session = session

    @property
    def task(self) -> TaskSpec | None:
        return self.session.task

    @property
    def first(self) -> StepResult[Observation] | None:
        return self.session.first

    @property
    def total_reward(self) -> float:
        return self.session.total_reward

    @property
    def steps(self) -> int:
        return self.session.steps

    @property
    def done(self) -> bool:
        return self.session.done

    def open(self) -> Self:
        run_sync(self.session.open())
        return self

    def reset(self, **kwargs: Any) -> StepResult[Observation]:
        return run_sync(self.session.reset(**kwargs))

    def step(self, action: Action | dict[str, Any]) -> StepResult[Observation]:
        return run_sync(self.session.step(action))

    def state(self) -> State:
        return run_sync(self.session.state())

    def list_tools(self) -> list[ToolInfo]:
        return run_sync(self.session.list_tools())

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | BaseModel | None = None,
        **kwargs: Any,
    ) -> ToolOutput:
        return run_sync(self.session.call_tool(name, arguments, **kwargs))

    def get_prompt(self) -> str:
        return run_sync(self.session.get_prompt())

    def close(self) -> None:
        run_sync(self.session.close())

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
