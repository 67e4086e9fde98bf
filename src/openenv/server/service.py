"""The state one served environment keeps: its factory, slots, threads and reaper."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from openenv.environment import Environment
from openenv.server.config import ConcurrencyConfig, ServerSettings
from openenv.server.factory import environment_class, state_class
from openenv.server.handoff import Handoff, LaneTicket
from openenv.server.sessions import SessionRegistry, SessionState
from openenv.types import Action, EnvironmentMetadata, Observation, State

if TYPE_CHECKING:
    from openenv.server.endpoint import Connection

__all__ = ["EnvService"]

logger = logging.getLogger("openenv.server")


class EnvService:
    """Everything the routes of one environment share; lives on ``app.state.openenv``."""

    def __init__(
        self,
        env_factory: Callable[[], Any],
        action_cls: type[Action],
        observation_cls: type[Observation],
        concurrency: ConcurrencyConfig,
        settings: ServerSettings,
        *,
        state_cls: type[State] | None = None,
        metadata: EnvironmentMetadata | None = None,
    ) -> None:
        env_cls = environment_class(env_factory)
        self.env_factory = env_factory
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.state_cls = state_cls or state_class(env_cls)
        self.concurrency = concurrency
        self.settings = settings
        self.metadata = metadata or _default_metadata(env_factory, env_cls)
        self.registry = SessionRegistry(concurrency.max_concurrent_envs)
        self.connections: set[Connection] = set()
        self.executor = self._new_executor()
        self.handoff = Handoff(self.executor, settings.max_threads)
        self._factory_ticket = LaneTicket()
        self._executor_stopped = False
        self.started_at = time.time()

    async def create_env(self) -> Environment[Any, Any, Any]:
        """Run the factory off the event loop (constructors may be slow)."""
        env = await self.handoff.call(self._factory_ticket, self.env_factory)
        if inspect.isawaitable(env):
            env = await env
        if not isinstance(env, Environment):
            raise TypeError(
                f"the environment factory returned {type(env).__name__}, expected an Environment"
            )
        return env

    def _new_executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(
            max_workers=self.settings.max_threads, thread_name_prefix="openenv-env"
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        # A fresh pool per run: the same app may be served again after a shutdown.
        if self._executor_stopped:
            self.executor = self._new_executor()
            self.handoff = Handoff(self.executor, self.settings.max_threads)
            self._executor_stopped = False
        reaper = None
        if self.concurrency.session_timeout is not None:
            reaper = asyncio.create_task(self._reap_idle(self.concurrency.session_timeout))
        try:
            yield
        finally:
            if reaper is not None:
                reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reaper
            await self._close_all("shutdown")
            self.handoff.shutdown()
            self.executor.shutdown(wait=False, cancel_futures=True)
            self._executor_stopped = True

    async def _close_all(self, reason: str) -> None:
        await _gather_logged(c.expire(reason) for c in list(self.connections))

    async def _reap_idle(self, idle_limit: float) -> None:
        interval = self.settings.reap_interval or min(max(idle_limit / 4, 0.01), 5.0)
        while True:
            await asyncio.sleep(interval)
            deadline = time.monotonic() - idle_limit
            idle = [
                c
                for c in self.connections
                if c.session.state is SessionState.OPEN
                and not c.session.busy
                and c.session.last_active < deadline
            ]
            for connection in idle:
                logger.info("session %s idle over %ss; closing", connection.session.id, idle_limit)
            await _gather_logged(connection.expire("idle_timeout") for connection in idle)


async def _gather_logged(awaitables: Iterable[Awaitable[None]]) -> None:
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            logger.error("closing a session failed", exc_info=result)


def _default_metadata(
    factory: Callable[[], Any], env_cls: type[Environment[Any, Any, Any]] | None
) -> EnvironmentMetadata:
    source: Any = env_cls or factory
    name = getattr(source, "__name__", type(source).__name__)
    doc = inspect.getdoc(source) or ""
    return EnvironmentMetadata(
        name=name,
        description=doc.split("\n\n", 1)[0].replace("\n", " "),
        supports_concurrent_sessions=bool(getattr(env_cls, "SUPPORTS_CONCURRENT_SESSIONS", False)),
    )
