"""The state one served environment keeps: its factory, slots, threads and reaper."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from openenv.environment import Environment
from openenv.errors import ServerSideError
from openenv.protocol import CloseCode, ErrorCode
from openenv.server import calls
from openenv.server.config import ConcurrencyConfig, ServerSettings
from openenv.server.factory import environment_class, state_class
from openenv.server.gc_tuning import tune_gc, unchanged
from openenv.server.handoff import Handoff, LaneTicket
from openenv.server.isolation import isolated_factory
from openenv.server.leaving import ClientLeft, acquire_unless_left
from openenv.server.metrics import Metrics
from openenv.server.recording import Recorder
from openenv.server.redact import failure_text, log_failure
from openenv.server.served import Served, ServedConnections
from openenv.server.sessions import Session
from openenv.server.slots import SessionRegistry, SlotBoard
from openenv.server.watchdog import LoopWatchdog
from openenv.tools import tools_of
from openenv.types import Action, EnvironmentMetadata, Observation, State

__all__ = ["LIVE_SERVICES", "EnvService", "FactoryTimeout", "Served", "SessionRefused"]

logger = logging.getLogger("openenv.server")

# How stale another worker's counters may be in a /metrics scrape under --workers.
METRICS_PUBLISH_SECONDS = 1.0
# A loop blocked this long is logged; /health says "degraded" for a while after.
LOOP_BLOCK_WARNING = 1.0


# The services running in this process, for a graceful shutdown to drain.
LIVE_SERVICES: weakref.WeakSet[EnvService] = weakref.WeakSet()


class FactoryTimeout(ServerSideError):
    """The environment factory overran ``factory_timeout``."""


class SessionRefused(ServerSideError):
    """No session could be opened; ``code``, ``close_code`` and ``details`` say why."""

    def __init__(
        self, code: ErrorCode, message: str, close_code: CloseCode, **details: Any
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.close_code = close_code
        self.details = details


class EnvService(ServedConnections):
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
        self.env_cls = env_cls
        self.env_factory = env_factory
        if settings.isolation == "process":
            if env_cls is not None and tools_of(env_cls):
                raise ValueError(
                    f"{env_cls.__name__} has @tool methods, which isolation='process' "
                    f"cannot reach; serve it without isolation"
                )
            self.env_factory = isolated_factory(env_factory)
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.state_cls = state_cls or state_class(env_cls)
        self.concurrency = concurrency
        self.settings = settings
        self.metadata = metadata or _default_metadata(env_factory, env_cls)
        self.registry = SessionRegistry(concurrency.max_concurrent_envs)
        self.metrics = Metrics(self.registry)
        # The loops of the servers serving this app now (usually one), each with
        # whether it is shutting down: two servers of one app in a process (a
        # test's fixture and a test) share its cap, and each drains only its own.
        self._serving: dict[asyncio.AbstractEventLoop, bool] = {}
        self._board: SlotBoard | None = None
        # Its board's name under `openenv serve --workers N`: one per environment of
        # the server (a multi-environment app names each by its path).
        self.board_name = str(self.metadata.name)
        self._restore_gc: Callable[[], None] = unchanged
        self._background: set[asyncio.Task[None]] = set()
        self.connections: set[Served] = set()
        self.metrics.count_v2_paused = self._v2_paused
        self.handoff = Handoff(settings.max_threads)
        self.recorder: Recorder | None = None  # made when serving starts (one file per process)
        # Factories (and closing what a late factory made) share one lane: cheap
        # constructors stay on the fast lane instead of growing the thread pool.
        self._factory_ticket = LaneTicket()
        self._handoff_stopped = False
        self.started_at = time.time()
        self.watchdog = LoopWatchdog(LOOP_BLOCK_WARNING, describe=self._describe_task)
        # Extra services (e.g. the MCP adapter) that live as long as the app runs.
        self.lifespan_hooks: list[Callable[[], AbstractAsyncContextManager[None]]] = []
        # Their sessions to end when a shutdown begins, beside /ws's (``drain``):
        # before the server waits for open responses, which their calls hold.
        self.drain_hooks: list[Callable[[], Awaitable[None]]] = []
        # ``/ws?session_id=``: the session an HTTP client opened, for a WebSocket to
        # drive (OpenEnv's /mcp sessions, with mcp=True); raises SessionRefused.
        self.attach_session: Callable[[str], Session] | None = None

    async def open_session(
        self, left: ClientLeft | None = None, kind: type[Session] = Session
    ) -> Session:
        """Reserve a slot (waiting in line up to ``queue_timeout``), make an environment.

        The one way in for every transport (``/ws``, ``/web/ws``, MCP, v2's
        ``open``). ``left`` tells when the client has left: one that leaves
        while it waits in line leaves the line at once, and gets no environment.

        Raises:
            SessionRefused: shutting down, at capacity, the client left, or the
                factory failed; nothing is left holding a slot.
        """
        await self.admit(left)
        return await self.make_session(kind)

    async def admit(self, left: ClientLeft | None = None) -> None:
        """``open_session``'s first half: reserve a slot, or raise ``SessionRefused``.

        Safe to cancel: a cancelled wait holds no slot. The caller owns the
        slot until it passes it to ``make_session``.
        """
        wait = self.concurrency.queue_timeout
        refused: SessionRefused | None = None
        if self.draining:
            refused = _shutting_down()
        elif not await (
            self.registry.acquire(wait)
            if left is None
            else acquire_unless_left(self.registry, wait, left)
        ):
            # Turned away from the line by a shutdown, out of time, or gone.
            if left is not None and left.is_set():
                raise SessionRefused(
                    ErrorCode.SESSION_ERROR,
                    "the client left while waiting for a slot",
                    CloseCode.GOING_AWAY,
                )
            refused = (
                _shutting_down()
                if self.draining
                else SessionRefused(
                    ErrorCode.CAPACITY_REACHED,
                    f"server at capacity ({self.registry.max_sessions} sessions); retry later",
                    CloseCode.TRY_AGAIN_LATER,
                    active_sessions=self.registry.totals()[0],  # every worker's, like the cap
                    max_sessions=self.registry.max_sessions,
                )
            )
        elif self.draining:  # a slot freed by the shutdown itself: no environment now
            self.registry.release()
            refused = _shutting_down()
        else:
            return
        self.metrics.errors[refused.code.value] += 1
        raise refused

    async def make_session(self, kind: type[Session] = Session) -> Session:
        """``open_session``'s second half: the environment for a slot ``admit`` reserved.

        Raises ``SessionRefused`` (``FACTORY_ERROR``) when the factory fails
        or overruns; the slot is then freed (or, for a factory still running
        on its thread, freed once it returns).
        """
        try:
            return kind(await self.create_env(), self)  # create_env frees its slot
        except FactoryTimeout as exc:
            logger.error("%s", exc)
            message = f"could not create the environment: {exc}"
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and calls.being_cancelled():
                raise
            # A SystemExit (sys.exit() in a constructor) too: the factory failed,
            # not the server, and its client is told so.
            log_failure(logger, "environment factory", exc)
            text = failure_text(exc, self.settings.error_details)
            message = f"could not create the environment: {text}"
        self.metrics.errors[ErrorCode.FACTORY_ERROR.value] += 1
        raise SessionRefused(ErrorCode.FACTORY_ERROR, message, CloseCode.INTERNAL_ERROR)

    async def create_env(self) -> Environment[Any, Any, Any]:
        """Run the factory off the event loop (constructors may be slow), within its deadline.

        The caller holds a slot. If a blocking factory overruns, the slot stays
        taken until it returns; then its environment is closed and the slot freed.
        """
        try:
            env = await calls.call(
                self.env_factory,
                submit=self._submit_factory,
                timeout=self.settings.factory_timeout,
            )
        except calls.DeadlineExceeded as exc:
            if exc.stuck is None:
                self.registry.release()
            else:
                exc.stuck.add_done_callback(self._reclaim_late_env)
            raise FactoryTimeout(f"the environment factory {exc}") from None
        except BaseException:
            self.registry.release()
            raise
        if not isinstance(env, Environment):
            self.registry.release()
            raise TypeError(
                f"the environment factory returned {type(env).__name__}, expected an Environment"
            )
        return env

    def _reclaim_late_env(self, future: asyncio.Future[Any]) -> None:
        async def reclaim() -> None:
            try:
                env = future.result()
                if isinstance(env, Environment):
                    await calls.call(
                        env.close,
                        submit=self._submit_factory,
                        timeout=self.settings.close_timeout,
                    )
            except BaseException as exc:
                if isinstance(exc, asyncio.CancelledError) and calls.being_cancelled():
                    raise
                # SystemExit too: out of this task it would stop the event loop.
                logger.exception("closing an environment whose factory overran failed")
            finally:
                self.registry.release()

        task = asyncio.get_running_loop().create_task(reclaim())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _submit_factory(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        /,
        *,
        timed: bool = False,
    ) -> asyncio.Future[Any]:
        return self.handoff.submit(self._factory_ticket, fn, args, kwargs, timed=timed)

    @property
    def draining(self) -> bool:
        """Whether the server running this loop is shutting down (sessions refused)."""
        try:
            return self._serving.get(asyncio.get_running_loop(), False)
        except RuntimeError:  # no loop running: no server here
            return False

    @property
    def loops(self) -> frozenset[asyncio.AbstractEventLoop]:
        """The loops of the servers serving this app now."""
        return frozenset(self._serving)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        first = not self._serving
        if first:
            # Fresh threads per run: the same app may be served again after a shutdown.
            if self._handoff_stopped:
                self.handoff = Handoff(self.settings.max_threads)
                self._handoff_stopped = False
            if self.settings.record is not None:
                self.recorder = Recorder(self.settings.record)
            # Under `openenv serve --workers N` every worker counts on one board: one cap.
            self._board = SlotBoard.from_env(self.board_name)
            if self._board is not None:
                self.registry.attach(self._board)
            LIVE_SERVICES.add(self)
            self._restore_gc = tune_gc(self.settings.gc_threshold)
            self.watchdog.start(loop)  # the first server's loop only
        # Serving from here: a start that failed above leaves no trace of this loop.
        self._serving[loop] = False
        tasks = [asyncio.create_task(self._abort_stalled_sends(self.settings.send_timeout))]
        board = self._board
        if board is not None:
            tasks.append(asyncio.create_task(self._publish_metrics(board)))
        if self.concurrency.session_timeout is not None:
            tasks.append(asyncio.create_task(self._reap_idle(self.concurrency.session_timeout)))
        try:
            async with contextlib.AsyncExitStack() as hooks:
                for hook in self.lifespan_hooks:
                    await hooks.enter_async_context(hook())
                yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.drain()
            if first:
                self.watchdog.stop()
            del self._serving[loop]
            if not self._serving:  # the last server of this app: let go of it all
                if board is not None:
                    board.publish(self.metrics.numbers())  # the last steps count too
                self.registry.detach()
                self._board = None
                if self.recorder is not None:
                    self.recorder.close()
                    self.recorder = None
                LIVE_SERVICES.discard(self)
                self.handoff.shutdown()
                self._handoff_stopped = True
                self._restore_gc()

    def health_problems(self) -> list[str]:
        """Why ``/health`` should say "degraded" (empty: it should not).

        Work waiting for a thread while both lanes are full of blocked calls,
        or an event loop blocked (by an ``async def`` step that blocks) lately.
        """
        problems = []
        if starved := self.handoff.starved:
            problems.append(
                f"{starved} environment call(s) wait for a worker thread: blocking calls "
                f"hold all {2 * self.settings.max_threads}"
            )
        if blocked := self.watchdog.recent_block():
            problems.append(blocked)
        return problems

    def _describe_task(self, task: asyncio.Task[Any] | None) -> str:
        if task is None:
            return "a callback outside any session"
        for connection in list(self.connections):
            if (described := connection.describe(task)) is not None:
                return described
        return f"task {task.get_name()}"

    async def _publish_metrics(self, board: SlotBoard) -> None:
        while True:
            board.publish(self.metrics.numbers())
            await asyncio.sleep(METRICS_PUBLISH_SECONDS)

    def _v2_paused(self) -> int:
        """The v2 connections not read until their replies go out (a v1 one has no ``paused``)."""
        return sum(1 for c in list(self.connections) if getattr(c, "paused", False))


def _shutting_down() -> SessionRefused:
    return SessionRefused(
        ErrorCode.SESSION_ERROR,
        "server shutting down; connect to another instance or retry later",
        CloseCode.GOING_AWAY,
        draining=True,  # pools place the session on another server
    )


def _default_metadata(
    factory: Callable[[], Any], env_cls: type[Environment[Any, Any, Any]] | None
) -> EnvironmentMetadata:
    source: Any = env_cls or factory
    name = getattr(source, "__name__", type(source).__name__)
    # Its own docstring only: inspect.getdoc would fall back to Environment's.
    while isinstance(source, functools.partial):
        source = source.func
    own = source.__dict__.get("__doc__") if isinstance(source, type) else source.__doc__
    doc = inspect.cleandoc(own) if isinstance(own, str) else ""
    return EnvironmentMetadata(
        name=name,
        description=doc.split("\n\n", 1)[0].replace("\n", " "),
        supports_concurrent_sessions=bool(getattr(env_cls, "SUPPORTS_CONCURRENT_SESSIONS", False)),
    )
