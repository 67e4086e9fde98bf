"""Deadlines on environment code: steps, resets, factories and close()."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import orjson
import pytest
from servers import Ping, PingEnvironment, Pong, Tracker, health, slots_free, until
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from openenv import (
    CapacityError,
    ConcurrencyConfig,
    DeadlineError,
    FactoryError,
    WebSocketEnvClient,
    create_app,
)
from openenv.client import ws_url
from openenv.testing import run_server


def client(url: str) -> WebSocketEnvClient:
    return WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong)


class HangingAsync(PingEnvironment):
    """An async step that never finishes unless cancelled."""

    cancelled = 0

    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        if action.block:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                type(self).cancelled += 1
                raise
        return PingEnvironment.step(self, action)


async def test_overrunning_async_step_is_cancelled_and_the_session_goes_on() -> None:
    app = create_app(HangingAsync, Ping, Pong, step_timeout=0.2)
    with run_server(app) as url:
        async with client(url) as env:
            await env.reset()
            with pytest.raises(DeadlineError, match=r"step\(\) did not return within 0.2s") as hit:
                await env.step(Ping(block=True))
            assert hit.value.fatal is False
            assert HangingAsync.cancelled == 1
            assert (await env.step(Ping(message="still here"))).observation.count == 1


async def test_overrunning_sync_step_ends_the_session_and_holds_its_slot() -> None:
    tracker, gate = Tracker(), threading.Event()
    factory = functools.partial(PingEnvironment, tracker, gate)
    app = create_app(factory, Ping, Pong, step_timeout=0.2)
    with run_server(app) as url:
        async with connect(ws_url(url)) as ws:
            await ws.send('{"type": "step", "data": {"block": true}, "id": 1}')
            error = orjson.loads(await ws.recv())
            assert error["data"]["code"] == "TIMEOUT"
            assert error["data"]["fatal"] is True
            assert error["id"] == 1
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1011
        # The thread still runs: the environment stays open and its slot taken.
        assert tracker.closed == []
        assert (await health(url))["active_sessions"] == 1
        with pytest.raises(CapacityError):
            await client(url).reset()
        gate.set()
        await tracker.until_closed(1)
        await slots_free(url)
        async with client(url) as env:
            assert (await env.reset()).observation.message == "reset:None"


async def test_overrunning_reset_has_its_own_deadline() -> None:
    class SlowReset(PingEnvironment):
        async def reset(self, seed: int | None = None, **kwargs: Any) -> Pong:  # type: ignore[override]
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    app = create_app(SlowReset, Ping, Pong, reset_timeout=0.2)
    with run_server(app) as url:
        async with client(url) as env:
            with pytest.raises(DeadlineError, match=r"reset\(\) did not return within 0.2s"):
                await env.reset()
            assert (await env.step(Ping())).observation.count == 1


async def test_overrunning_factory_is_a_factory_error_and_its_env_is_closed_later() -> None:
    tracker, gate = Tracker(), threading.Event()

    def slow_factory() -> PingEnvironment:
        gate.wait(30)
        return PingEnvironment(tracker)

    app = create_app(slow_factory, Ping, Pong, factory_timeout=0.2)
    with run_server(app) as url:
        with pytest.raises(FactoryError, match=r"did not return within 0.2s"):
            await client(url).reset()
        assert (await health(url))["active_sessions"] == 1  # held until the factory returns
        gate.set()
        await tracker.until_closed(1)
        await until(lambda: _active(url, 0), what="slot freed")


async def _active(url: str, expected: int) -> bool:
    return (await health(url))["active_sessions"] == expected


class BadClose(PingEnvironment):
    def close(self) -> None:
        super().close()
        raise OSError("disk on fire")


class HangingClose(PingEnvironment):
    def close(self) -> None:
        super().close()
        assert self.gate is not None
        self.gate.wait(30)


@pytest.mark.parametrize("env_cls", [BadClose, HangingClose])
async def test_close_that_raises_or_hangs_still_frees_the_slot(env_cls: type) -> None:
    tracker, gate = Tracker(), threading.Event()
    app = create_app(
        functools.partial(env_cls, tracker, gate),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=1),
        close_timeout=0.2,
    )
    try:
        with run_server(app) as url:
            for _ in range(2):  # the one slot is usable again after each close
                async with client(url) as env:
                    await env.reset()
                await until(lambda: _active(url, 0), what="slot freed")
    finally:
        gate.set()
    assert len(tracker.closed) == 2
