"""The blocking client: the async client, driven from a background event loop.

One daemon thread runs one event loop for every sync client in the process,
so the blocking API works anywhere, including inside a running event loop
(a notebook), and opening many sync clients costs no extra threads.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, cast

from pydantic import BaseModel

from openenv.client._base import ActT, ObsT, StateT
from openenv.tasks import TaskSpec
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import StepResult

if TYPE_CHECKING:
    from openenv.client.async_ import EnvClient

__all__ = ["SyncEnvClient", "blocked_loop", "forked_away", "run_sync"]

_T = TypeVar("_T")
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="openenv-sync-client", daemon=True
            )
            thread.start()
            _loop = loop
        return _loop


# Event loops whose thread is blocked in ``run_sync``: nothing scheduled on them
# runs until it returns.
_blocked: set[asyncio.AbstractEventLoop] = set()


# The shared loop of the process this one was forked from: its copy here still
# says it is running, but no thread runs it, so nothing put on it is answered.
_orphans: set[asyncio.AbstractEventLoop] = set()


def _after_fork_in_child() -> None:
    global _loop, _loop_lock
    if _loop is not None:
        _orphans.add(_loop)
    _loop, _loop_lock = None, threading.Lock()  # the lock may have been held by another thread
    _blocked.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_away(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` was the shared loop of the process this one was forked from."""
    return loop in _orphans


def blocked_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop``'s thread is waiting in ``run_sync`` (so ``loop`` cannot run)."""
    return loop in _blocked


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine on the shared background loop and wait for its result.

    If the wait is interrupted (``KeyboardInterrupt``), the coroutine is
    cancelled rather than left running unseen: an interrupted session opening
    would otherwise go on to hold a slot that nobody can close.
    """
    try:
        caller: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        caller = None
    background = _background_loop()
    if caller is background:  # it would wait for itself, for ever
        coro.close()
        raise RuntimeError(
            "a blocking openenv call made on the sync clients' own event loop; await it instead"
        )
    if caller is not None:
        _blocked.add(caller)
    try:
        future = asyncio.run_coroutine_threadsafe(coro, background)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # a no-op when the coroutine itself raised
            raise
    finally:
        if caller is not None:
            _blocked.discard(caller)


def _blocking(call: Coroutine[Any, Any, _T]) -> _T:
    # ``EnvClient``'s methods already block when no event loop runs in this
    # thread and return a coroutine only inside one (a notebook, say).
    if inspect.iscoroutine(call):
        return cast(_T, run_sync(call))
    return cast(_T, call)


class SyncEnvClient(Generic[ActT, ObsT, StateT]):
    """Blocking twin of ``EnvClient``; get one with ``EnvClient(...).sync()``.

    >>> from echo_env.client import EchoEnv
    >>> from echo_env.models import EchoAction
    >>> with EchoEnv(ECHO_URL).sync() as env:  # doctest: +SKIP
    ...     env.reset()
    ...     env.step(EchoAction(message="hi")).observation.echoed_message
    'hi'
    """

    def __init__(self, client: EnvClient[ActT, ObsT, StateT]) -> None:
        self.client = client

    @property
    def async_client(self) -> EnvClient[ActT, ObsT, StateT]:
        """The client this one drives (OpenEnv's name for it)."""
        return self.client

    def __getattr__(self, name: str) -> Any:
        # As OpenEnv's SyncEnvClient: what is not defined here is the client's,
        # its methods blocking (a subclass's own ``async def`` ones included).
        client = self.__dict__.get("client")
        if client is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        attribute = getattr(client, name)
        if not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            return _blocking(attribute(*args, **kwargs))

        return blocking

    def connect(self) -> Self:
        """Open the connection (and with it a server-side session)."""
        _blocking(self.client.connect())
        return self

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> StepResult[ObsT]:
        """Start a new episode; see ``EnvClient.reset``."""
        return _blocking(self.client.reset(seed=seed, episode_id=episode_id, **kwargs))

    def step(self, action: ActT | dict[str, Any]) -> StepResult[ObsT]:
        """Apply one action; see ``EnvClient.step``."""
        return _blocking(self.client.step(action))

    def state(self) -> StateT:
        """The environment's current state."""
        return _blocking(self.client.state())

    def list_tools(self) -> list[ToolInfo]:
        """The environment's tools; see ``EnvClient.list_tools``."""
        return _blocking(self.client.list_tools())

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | BaseModel | None = None,
        **kwargs: Any,
    ) -> ToolOutput:
        """Call a tool; see ``EnvClient.call_tool``."""
        if arguments is None:  # as given: MCPToolClient takes keyword arguments only
            return _blocking(self.client.call_tool(name, **kwargs))
        return _blocking(self.client.call_tool(name, arguments, **kwargs))

    def get_prompt(self, task: TaskSpec | None = None) -> str:
        """The prompt of ``task`` (default: the task of the last reset)."""
        return _blocking(self.client.get_prompt(task))

    def close(self) -> None:
        """End the session. Idempotent."""
        _blocking(self.client.close())

    def __enter__(self) -> Self:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
