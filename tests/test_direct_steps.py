"""Steps started from the protocol's callback (``Session.try_step``).

On openenv's WebSocket protocol a well-formed step runs and replies without
waking the session's task (a plain ``def`` on its lane, an ``async def`` in a
task of its own); everything else goes through ``Session.handle``. These tests pin that
both paths answer alike and that the direct one keeps the guarantees: order,
no ``close()`` beside a running step, errors, and a freed slot. What is
particular to an ``async def`` step that suspends is in
``test_async_direct_steps.py``.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
import weakref
from typing import Any

import orjson
import pytest
from pydantic import field_validator
from servers import (
    AsyncPingEnvironment,
    Ping,
    PingEnvironment,
    Pong,
    Tracker,
    health,
    live_ws_protocol,
    slots_free,
    until,
)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from openenv import ConcurrencyConfig, create_app
from openenv.client import ws_url
from openenv.server.sessions import Session, SessionState
from openenv.testing import run_server

OURS = "openenv.server.wsprotocol:WebSocketProtocol"
STOCK = "websockets-sansio"


def session_socket(url: str) -> Any:
    # As openenv's clients connect: compression would turn the fast framing off.
    return connect(ws_url(url), compression=None)


def ping_app(env_factory: Any = PingEnvironment, action_cls: type[Ping] = Ping) -> Any:
    return create_app(env_factory, action_cls, Pong, ConcurrencyConfig(max_concurrent_envs=1))


async def assert_internal_error(ws: Any, frame: object) -> None:
    """``frame`` is answered "internal server error", then the session closes with 1011."""
    error = await exchange(ws, frame)
    assert error["data"] == {"code": "SESSION_ERROR", "message": "internal server error"}
    with pytest.raises(ConnectionClosed) as closed:
        await ws.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1011


def count_handle(monkeypatch: pytest.MonkeyPatch) -> list[str | bytes]:
    """The frames ``Session.handle`` answers from now on (the task path)."""
    handled: list[str | bytes] = []
    handle = Session.handle

    async def counted(self: Session, frame: str | bytes) -> str | None:
        handled.append(frame)
        return await handle(self, frame)

    monkeypatch.setattr(Session, "handle", counted)
    return handled


async def exchange(ws: Any, frame: object) -> dict[str, Any]:
    await ws.send(frame if isinstance(frame, str) else orjson.dumps(frame).decode())
    reply: dict[str, Any] = orjson.loads(await ws.recv())
    return reply


FRAMES: list[object] = [
    {"type": "reset", "data": {"seed": 3}},
    {"type": "step", "data": {"message": "a"}, "id": 1},
    {"type": "step", "data": {"message": "b"}},
    {"type": "step", "data": {"fail": True}, "id": "f"},
    {"type": "step", "data": {"message": 42}, "id": 2},
    "not json",
    {"type": "step", "data": {"message": "c"}, "id": 3},
    {"type": "state"},
]


BOTH_KINDS = pytest.mark.parametrize(
    "env_cls", [PingEnvironment, AsyncPingEnvironment], ids=["def", "async"]
)


async def replies_over(ws_protocol: str, env_cls: Any) -> list[dict[str, Any]]:
    with run_server(ping_app(env_cls), ws=ws_protocol) as url:
        async with session_socket(url) as ws:
            return [await exchange(ws, frame) for frame in FRAMES]


@BOTH_KINDS
async def test_both_paths_answer_every_frame_alike(env_cls: Any) -> None:
    ours, stock = await replies_over(OURS, env_cls), await replies_over(STOCK, env_cls)
    assert ours == stock
    assert [r["type"] for r in ours] == ["observation"] * 3 + ["error"] * 3 + [
        "observation",
        "state",
    ]
    assert [r["data"]["code"] for r in ours[3:6]] == [
        "EXECUTION_ERROR",
        "VALIDATION_ERROR",
        "INVALID_JSON",
    ]
    assert ours[6]["data"]["observation"] == {"message": "c", "count": 3}


@BOTH_KINDS
@pytest.mark.parametrize(("ws_protocol", "handled"), [(OURS, 1), (STOCK, 4)])
async def test_steps_skip_handle_only_on_openenv_protocol(
    ws_protocol: str, handled: int, env_cls: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_handle(monkeypatch)
    with run_server(ping_app(env_cls), ws=ws_protocol) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            for i in range(3):
                reply = await exchange(ws, {"type": "step", "data": {"message": str(i)}})
                assert reply["data"]["observation"]["count"] == i + 1
    assert len(calls) == handled


@BOTH_KINDS
async def test_pipelined_frames_keep_their_order_across_both_paths(env_cls: Any) -> None:
    # Frames sent while a direct step runs go to handle(), which waits for it.
    frames: list[dict[str, Any]] = []
    for i in range(150):
        if i % 50 == 25:
            frames.append({"type": "reset", "id": i})
        else:
            frames.append({"type": "step", "data": {"message": str(i)}, "id": i})
    with run_server(ping_app(env_cls)) as url:
        async with session_socket(url) as ws:
            for frame in frames:
                await ws.send(orjson.dumps(frame).decode())
            replies = [orjson.loads(await ws.recv()) for _ in frames]
    assert [r["id"] for r in replies] == list(range(150))
    counts = [r["data"]["observation"].get("count") for r in replies]
    expected: list[int] = []
    count = 0
    for frame in frames:
        count = 0 if frame["type"] == "reset" else count + 1
        expected.append(count)
    assert counts == expected


class Recording(PingEnvironment):
    """Writes down when its step starts and returns, and when it is closed."""

    def __init__(self, tracker: Tracker, gate: threading.Event, events: list[str]) -> None:
        super().__init__(tracker, gate)
        self.events = events

    def step(self, action: Ping, **kwargs: Any) -> Pong:
        self.events.append("step")
        try:
            return super().step(action)
        finally:
            self.events.append("step returned")

    def close(self) -> None:
        self.events.append("close")
        super().close()


async def test_close_waits_for_a_direct_step_whose_client_vanished() -> None:
    tracker, gate = Tracker(), threading.Event()
    events: list[str] = []
    app = ping_app(functools.partial(Recording, tracker, gate, events))
    with run_server(app) as url:
        ws = await session_socket(url)
        await exchange(ws, {"type": "reset"})
        await ws.send(orjson.dumps({"type": "step", "data": {"block": True}}).decode())
        await until(lambda: _true(events == ["step"]), what="the step to start")
        (session,) = app.state.openenv.registry.sessions.values()
        ws.transport.abort()
        # The server has seen the disconnect and is closing the session...
        await until(lambda: _true(session.state is SessionState.CLOSED), what="closing")
        # ...but close() waits for the step still running on its thread.
        assert events == ["step"]
        gate.set()
        await tracker.until_closed(1)
        await slots_free(url)
    assert events == ["step", "step returned", "close"]


async def test_a_session_ended_from_outside_waits_for_its_direct_step() -> None:
    # What a shutdown or the idle reaper does: the client is told at once, but
    # close() and the slot wait for the step still running on its thread.
    tracker, gate = Tracker(), threading.Event()
    events: list[str] = []
    app = ping_app(functools.partial(Recording, tracker, gate, events))
    with run_server(app) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            await ws.send(orjson.dumps({"type": "step", "data": {"block": True}}).decode())
            await until(lambda: _true(events == ["step"]), what="the step to start")
            (connection,) = app.state.openenv.connections
            server_loop = connection.closed.get_loop()
            ending = asyncio.run_coroutine_threadsafe(connection.expire("shutdown"), server_loop)
            error = orjson.loads(await ws.recv())
            assert error["data"]["code"] == "SESSION_ERROR"
            assert error["data"]["message"] == "server shutting down"
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1001
            await asyncio.wrap_future(ending)
        assert events == ["step"]
        assert (await health(url))["active_sessions"] == 1  # the step still holds it
        gate.set()
        await tracker.until_closed(1)
        await slots_free(url)
    assert events == ["step", "step returned", "close"]


class Opaque(Pong):
    """An observation with a value the wire format cannot carry."""

    payload: Any = None


class Unsendable(PingEnvironment):
    def step(self, action: Ping, **kwargs: Any) -> Pong:
        return Opaque(payload=object())


class AsyncUnsendable(PingEnvironment):
    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        return Opaque(payload=object())


@pytest.mark.parametrize("env_cls", [Unsendable, AsyncUnsendable])
async def test_a_reply_that_cannot_be_encoded_ends_the_session_with_1011(
    env_cls: type[PingEnvironment],
) -> None:
    tracker = Tracker()
    with run_server(ping_app(functools.partial(env_cls, tracker))) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            await assert_internal_error(ws, {"type": "step", "data": {}})
        await tracker.until_closed(1)
        await slots_free(url)


class CoroutineStep(PingEnvironment):
    """A plain ``def step`` that hands back a coroutine, which the server awaits."""

    def step(self, action: Ping, **kwargs: Any) -> Any:  # type: ignore[override]
        async def later() -> Pong:
            await asyncio.sleep(0)
            return PingEnvironment.step(self, action)

        return later()


async def test_a_plain_def_step_may_return_an_awaitable() -> None:
    with run_server(ping_app(CoroutineStep)) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            for i in range(3):
                reply = await exchange(ws, {"type": "step", "data": {"message": "x"}, "id": i})
                assert reply["id"] == i
                assert reply["data"]["observation"]["count"] == i + 1


async def _true(value: bool) -> bool:
    return value


async def test_a_finished_session_leaves_no_cycle_through_its_protocol() -> None:
    # The direct channel links the protocol and the session's connection both
    # ways while the session runs; both links go when it ends.
    gc.disable()
    try:
        with run_server(ping_app()) as url:
            async with session_socket(url) as ws:
                await exchange(ws, {"type": "reset"})
                await exchange(ws, {"type": "step", "data": {"message": "x"}})
                server_side = live_ws_protocol()
                freed = weakref.ref(server_side)
                del server_side
            await slots_free(url)
            await until(lambda: _true(freed() is None), what="the protocol to be freed")
    finally:
        gc.enable()


class Picky(Ping):
    """An action whose validator fails with something pydantic does not wrap."""

    @field_validator("message")
    @classmethod
    def _no_boom(cls, value: str) -> str:
        if value == "boom":
            raise TypeError("a validator's own bug")
        return value


class PickyEnvironment(PingEnvironment):
    def step(self, action: Picky, **kwargs: Any) -> Pong:  # type: ignore[override]
        return super().step(action)


@pytest.mark.parametrize("ws_protocol", [OURS, STOCK])
async def test_a_validator_that_raises_ends_the_session_the_same_way(ws_protocol: str) -> None:
    tracker = Tracker()
    app = ping_app(functools.partial(PickyEnvironment, tracker), Picky)
    with run_server(app, ws=ws_protocol) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            ok = await exchange(ws, {"type": "step", "data": {"message": "fine"}})
            assert ok["data"]["observation"]["count"] == 1
            await assert_internal_error(ws, {"type": "step", "data": {"message": "boom"}})
        await tracker.until_closed(1)
        await slots_free(url)


class Exiting(PingEnvironment):
    def step(self, action: Ping, **kwargs: Any) -> Pong:
        raise SystemExit(3)  # not an Exception: no error of the environment's to report


class AsyncExiting(PingEnvironment):
    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        raise SystemExit(3)


class AsyncExitingLater(PingEnvironment):
    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        await asyncio.sleep(0)  # in the step's task now, not the protocol's callback
        raise SystemExit(3)


class AwaitsACancelledFuture(PingEnvironment):
    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        # Its own CancelledError (some other code cancelled what it awaited),
        # not a cancellation of the server's task.
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        return await future  # type: ignore[no-any-return]


class RaisesCancelled(PingEnvironment):
    def step(self, action: Ping, **kwargs: Any) -> Pong:
        raise asyncio.CancelledError


@pytest.mark.parametrize(
    "env_cls",
    [Exiting, AsyncExiting, AsyncExitingLater, AwaitsACancelledFuture, RaisesCancelled],
    ids=["def", "async", "async-after-suspending", "async-cancelled", "def-cancelled"],
)
@pytest.mark.parametrize("ws_protocol", [OURS, STOCK])
async def test_a_step_that_raises_a_base_exception_ends_only_its_session(
    env_cls: Any, ws_protocol: str
) -> None:
    tracker = Tracker()
    with run_server(ping_app(functools.partial(env_cls, tracker)), ws=ws_protocol) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            await assert_internal_error(ws, {"type": "step", "data": {}})
        await tracker.until_closed(1)
        await slots_free(url)
        assert (await health(url))["status"] == "healthy"  # the server goes on


@pytest.mark.parametrize("env_cls", [PingEnvironment, AsyncPingEnvironment], ids=["def", "async"])
async def test_a_reply_waits_while_the_transport_asks_to_pause_writing(env_cls: Any) -> None:
    # Replies skip ASGI's send() only while the transport takes more bytes; once
    # it asks the protocol to pause writing, the reply waits in send() until
    # the buffer drains, so a client that stops reading cannot grow it.
    with run_server(ping_app(env_cls)) as url:
        async with session_socket(url) as ws:
            assert (await exchange(ws, {"type": "reset", "data": {}}))["type"] == "observation"
            server_side = live_ws_protocol()
            loop = server_side.loop

            async def paused() -> bool:
                return not server_side.writable.is_set()

            async def reply_waits() -> bool:
                return bool(server_side.writable._waiters)

            def pause_writing_only() -> None:
                # Reading pauses with writing; frames of a read that was under
                # way when it filled the buffer still come, as this one does.
                server_side.pause_writing()
                server_side.read_paused = False
                server_side.transport.resume_reading()

            loop.call_soon_threadsafe(pause_writing_only)
            await until(paused, what="writing paused")
            await ws.send(orjson.dumps({"type": "step", "data": {"message": "late"}}).decode())
            await until(reply_waits, what="the reply waiting for the transport")
            loop.call_soon_threadsafe(server_side.resume_writing)
            reply = orjson.loads(await ws.recv())
            assert reply["data"]["observation"]["message"] == "late"
