"""Real servers for tests: uvicorn on a free loopback port, and small test environments."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

from openenv import (
    Action,
    ConcurrencyConfig,
    EnvError,
    Environment,
    Observation,
    State,
    create_app,
)


class Tracker:
    """Counts environment instances created and closed, across threads."""

    def __init__(self) -> None:
        self.created: list[int] = []
        self.closed: list[int] = []
        self._cond = threading.Condition()

    def on_create(self, env: object) -> None:
        with self._cond:
            self.created.append(id(env))
            self._cond.notify_all()

    def on_close(self, env: object) -> None:
        with self._cond:
            self.closed.append(id(env))
            self._cond.notify_all()

    def wait_closed(self, count: int, timeout: float = 10.0) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.closed) >= count, timeout)
        assert ok, f"expected {count} environments closed, got {len(self.closed)}"

    async def until_closed(self, count: int, wait: float = 10.0) -> None:
        """``wait_closed`` without blocking the caller's event loop."""
        await asyncio.to_thread(self.wait_closed, count, wait)

    async def until_created(self, count: int, wait: float = 10.0) -> None:
        def created() -> None:
            with self._cond:
                ok = self._cond.wait_for(lambda: len(self.created) >= count, wait)
            assert ok, f"expected {count} environments created, got {len(self.created)}"

        await asyncio.to_thread(created)


class Ping(Action):
    message: str = "ping"
    fail: bool = False
    block: bool = False


class Pong(Observation):
    message: str = ""
    count: int = 0


class PingState(State):
    last: str = ""


class PingEnvironment(Environment[Ping, Pong, PingState]):
    """A test environment: counts steps, raises on request, blocks on request."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, tracker: Tracker | None = None, gate: threading.Event | None = None) -> None:
        self.tracker = tracker
        self.gate = gate
        self._state = PingState()
        if tracker is not None:
            tracker.on_create(self)

    def reset(  # type: ignore[override]
        self, seed: int | None = None, episode_id: str | None = None, difficulty: int = 0
    ) -> Pong:
        self._state = PingState(episode_id=episode_id or f"seed-{seed}")
        return Pong(message=f"reset:{seed}" + (f":{difficulty}" if difficulty else ""))

    def step(self, action: Ping, **kwargs: Any) -> Pong:
        if action.fail:
            raise ValueError("asked to fail")
        if action.block:
            assert self.gate is not None
            self.gate.wait(30)
        self._state.step_count += 1
        self._state.last = action.message
        return Pong(message=action.message, count=self._state.step_count, reward=1.0)

    @property
    def state(self) -> PingState:
        return self._state

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.on_close(self)


class Hold(Action):
    wait: bool = False


class Held(Observation):
    steps: int = 0


class HoldingEnvironment(Environment[Hold, Held, State]):
    """Steps asked to ``wait`` say they have begun (``entered``), then wait for ``gate``."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, entered: threading.Semaphore, gate: threading.Event) -> None:
        self.entered, self.gate = entered, gate
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Held:
        self._state = State(episode_id=episode_id)
        return Held()

    def step(self, action: Hold, **kwargs: Any) -> Held:
        self._state.step_count += 1
        if action.wait:
            self.entered.release()
            self.gate.wait(30)
        return Held(steps=self._state.step_count)

    @property
    def state(self) -> State:
        return self._state


class Holding:
    """An app of ``HoldingEnvironment``: ``entered`` counts the waiting steps begun,
    ``gate`` lets them all end."""

    def __init__(self, max_envs: int) -> None:
        self.entered, self.gate = threading.Semaphore(0), threading.Event()
        factory = functools.partial(HoldingEnvironment, self.entered, self.gate)
        self.app = create_app(factory, Hold, Held, ConcurrencyConfig(max_concurrent_envs=max_envs))

    async def until_entered(self, count: int = 1) -> None:
        """Wait until ``count`` more waiting steps have begun."""
        for _ in range(count):
            assert await asyncio.to_thread(self.entered.acquire, True, 10)


class AsyncPingEnvironment(PingEnvironment):
    """The same, with ``async def`` reset and step."""

    async def reset(  # type: ignore[override]
        self, seed: int | None = None, episode_id: str | None = None, difficulty: int = 0
    ) -> Pong:
        return PingEnvironment.reset(self, seed, episode_id, difficulty)

    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        if action.block:
            raise EnvError("async environments do not block")
        return PingEnvironment.step(self, action)


def ping_app(tracker: Tracker, max_envs: int = 4, **kwargs: Any) -> Any:
    """An app of ``PingEnvironment`` (or ``env_cls=``), counted by ``tracker``; ``gate``
    holds blocking steps, ``session_timeout`` reaps idle sessions, the rest go to
    ``create_app``."""
    gate = kwargs.pop("gate", None)
    env_cls = kwargs.pop("env_cls", PingEnvironment)
    concurrency = ConcurrencyConfig(
        max_concurrent_envs=max_envs, session_timeout=kwargs.pop("session_timeout", None)
    )
    return create_app(functools.partial(env_cls, tracker, gate), Ping, Pong, concurrency, **kwargs)


async def until(predicate: Any, wait: float = 10.0, what: str = "condition") -> None:
    """Poll an async predicate until it holds, failing after ``wait`` seconds."""
    deadline = asyncio.get_running_loop().time() + wait
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} did not hold within {wait}s")
        await asyncio.sleep(0.01)


async def health(url: str) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(base_url=url) as http:
        reply: dict[str, Any] = (await http.get("/health")).json()
        return reply


async def slots_free(url: str, wait: float = 10.0) -> None:
    """Wait until the server reports no session holding a slot."""

    async def free() -> bool:
        return (await health(url))["active_sessions"] == 0

    await until(free, wait, "all session slots free")


def live_ws_protocol() -> Any:
    """The one open server-side ``WebSocketProtocol`` of a server run in this process."""
    import gc

    from openenv.server.wsprotocol import WebSocketProtocol

    # type(), not isinstance(): the latter dereferences weak proxies, dead ones raise.
    (protocol,) = [
        o
        for o in gc.get_objects()
        if type(o) is WebSocketProtocol and o.handshake_complete and not o.disconnected
    ]
    return protocol
