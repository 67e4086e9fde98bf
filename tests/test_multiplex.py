"""Protocol v2 on a real server: many sessions per connection, batches, isolation, slots."""

from __future__ import annotations

import asyncio
import functools
import gc
import random
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import servers
from pydantic import field_serializer
from servers import AsyncPingEnvironment, Ping, PingEnvironment, Pong, Tracker, health, slots_free
from v2_wire import open_sessions, raw_v2, replies, send, steps_of
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import (
    CapacityError,
    ConcurrencyConfig,
    DeadlineError,
    EnvExecutionError,
    EnvTimeoutError,
    EnvValidationError,
    MuxClient,
    SessionClosedError,
    SessionError,
    StepResult,
    WebSocketEnvClient,
    create_app,
    protocol,
)
from openenv.client import ws_url
from openenv.testing import run_server

# Room for every session a test here opens, unless it says otherwise.
ping_app = functools.partial(servers.ping_app, max_envs=8)


def mux(url: str, **options: Any) -> MuxClient[Ping, Pong, Any]:
    return MuxClient(url, action_cls=Ping, observation_cls=Pong, **options)


@pytest.mark.parametrize("ws", ["openenv", "websockets-sansio"])
async def test_v1_and_v2_clients_side_by_side(ws: str) -> None:
    tracker = Tracker()
    config = {} if ws == "openenv" else {"ws": ws}
    with run_server(ping_app(tracker, max_envs=6), **config) as url:
        async with (
            WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as v1,
            mux(url) as v2,
        ):
            sessions = await v2.open(4)
            await v1.reset(seed=1)
            first = await v2.reset(sessions, seed=range(4))
            assert [r.observation.message for r in first] == [f"reset:{i}" for i in range(4)]
            assert (await health(url))["active_sessions"] == 5  # the cap counts sessions
            for _ in range(3):
                one = await v1.step(Ping(message="v1"))
                many = await v2.step(sessions, [Ping(message=f"s{i}") for i in range(4)])
            assert one.observation.count == 3
            assert [(r.observation.message, r.observation.count) for r in many] == [
                (f"s{i}", 3) for i in range(4)
            ]
            # A v1 connection still gets v1 frames: one object per reply, no session.
            async with connect(ws_url(url)) as raw:
                await raw.send('{"type":"reset","data":{"seed":3},"id":"r"}')
                reply = orjson.loads(await raw.recv())
            assert reply == {
                "type": "observation",
                "data": {
                    "observation": {"message": "reset:3", "count": 0},
                    "reward": None,
                    "done": False,
                },
                "id": "r",
            }
        await slots_free(url)
        assert sorted(tracker.closed) == sorted(tracker.created)


async def test_thousand_sessions_over_four_connections() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=1000)) as url:
        clients = [mux(url) for _ in range(4)]
        try:
            groups = await asyncio.gather(*(c.open(250) for c in clients))
            assert (await health(url))["active_sessions"] == 1000
            with pytest.raises(CapacityError):
                await clients[0].open(1)  # the 1,001st session, not the 5th connection
            for client, group in zip(clients, groups, strict=True):
                await client.reset(group, seed=range(250))

            async def play(client: MuxClient[Ping, Pong, Any], group: list[Any], c: int) -> None:
                for n in range(1, 4):
                    results = await client.step(
                        group, [Ping(message=f"{c}-{i}") for i in range(250)]
                    )
                    assert [(r.observation.message, r.observation.count) for r in results] == [
                        (f"{c}-{i}", n) for i in range(250)
                    ]

            await asyncio.gather(
                *(play(c, g, i) for i, (c, g) in enumerate(zip(clients, groups, strict=False)))
            )
            # Single-session calls from many coroutines at once share the connection.
            singles = await asyncio.gather(*(s.step(Ping(message="one")) for s in groups[0]))
            assert {r.observation.count for r in singles} == {4}
        finally:
            await asyncio.gather(*(c.close() for c in clients))
        await slots_free(url)
        assert len(tracker.created) == 1000
        await tracker.until_closed(1000)


@pytest.mark.parametrize("env_cls", [PingEnvironment, AsyncPingEnvironment])
async def test_one_sessions_errors_touch_no_other(env_cls: type[PingEnvironment]) -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, env_cls=env_cls)) as url:
        async with mux(url) as client:
            sessions = await client.open(4)
            await client.reset(sessions)
            actions: list[Any] = [
                Ping(message="a"),
                Ping(fail=True),
                {"bogus": 1},
                Ping(message="d"),
            ]
            results = await client.step(sessions, actions, return_exceptions=True)
            assert isinstance(results[0], StepResult)
            assert results[0].observation.count == 1
            assert isinstance(results[1], EnvExecutionError)
            assert isinstance(results[2], EnvValidationError)
            assert isinstance(results[3], StepResult)
            assert results[3].observation.count == 1
            with pytest.raises(EnvExecutionError):  # without return_exceptions: raised
                await client.step(sessions, [Ping(), Ping(fail=True), Ping(), Ping()])
            again = await client.step(sessions, [Ping(message=str(i)) for i in range(4)])
            assert [r.observation.count for r in again] == [3, 1, 2, 3]
            assert (await health(url))["active_sessions"] == 4


async def test_a_batch_raising_one_error_leaves_no_other_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with run_server(ping_app(Tracker())) as url:
        async with mux(url) as client:
            sessions = await client.open(3)
            with pytest.raises(EnvExecutionError) as raised:
                await client.step(sessions, [Ping(fail=True)] * 3)
            del raised  # its traceback held the other sessions' errors
            gc.collect()
            # The first error is raised; the others are not logged by asyncio as
            # "never retrieved" (an ERROR in the caller's log for each session).
            assert not [r for r in caplog.records if r.name == "asyncio"]
            again = await client.step(sessions, [Ping()] * 3)
            assert [r.observation.count for r in again] == [1, 1, 1]


async def test_a_fatal_error_closes_only_its_session() -> None:
    tracker, gate = Tracker(), threading.Event()
    app = ping_app(tracker, gate=gate, step_timeout=0.2)
    with run_server(app) as url:
        async with mux(url) as client:
            sessions = await client.open(3)
            await client.reset(sessions)
            results = await client.step(
                sessions, [Ping(), Ping(block=True), Ping()], return_exceptions=True
            )
            assert isinstance(results[1], DeadlineError)
            assert "session is closed" in str(results[1])
            assert sessions[1].closed
            assert not sessions[0].closed
            with pytest.raises(SessionClosedError):
                await sessions[1].step(Ping())
            assert (await sessions[0].step(Ping())).observation.count == 2
            # The overrunning call still holds its slot and environment...
            assert (await health(url))["active_sessions"] == 3
            gate.set()
            await tracker.until_closed(1)  # ...until its thread returns
            assert (await health(url))["active_sessions"] == 2
            assert (await sessions[2].step(Ping())).observation.count == 2


async def test_what_waited_behind_a_step_past_its_deadline_is_answered_at_once() -> None:
    tracker, gate = Tracker(), threading.Event()
    with run_server(ping_app(tracker, max_envs=2, gate=gate, step_timeout=0.2)) as url:
        ws = await raw_v2(url)
        try:
            await open_sessions(ws, 1)
            await send(
                ws,
                [
                    {"session": 0, "type": "step", "data": {"block": True}, "id": 1},
                    {"session": 0, "type": "state", "id": 2},
                    {"session": 0, "type": "open", "id": 3},
                    {"session": 0, "type": "step", "data": {}, "id": 4},
                ],
            )
            # All of it while the first step's thread is still blocked on the gate:
            # nothing waits for close(), which waits for that thread.
            got = await replies(ws, 5)
            assert [(r.get("id"), r["type"]) for r in got] == [
                (1, "error"),
                (None, "closed"),
                (2, "error"),
                (3, "opened"),
                (4, "observation"),
            ]
            assert got[0]["data"]["code"] == "TIMEOUT"
            assert got[2]["data"]["code"] == "SESSION_ERROR"
            assert got[4]["data"]["observation"]["count"] == 1  # a new environment
        finally:
            gate.set()
            await ws.close()
        await tracker.until_closed(2)
        await slots_free(url)


async def test_close_then_open_of_one_name_is_served_in_order() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=1)) as url:  # the open needs the close's slot
        ws = await raw_v2(url)
        try:
            await send(ws, [{"session": 0, "type": "open", "id": 1}])
            (first,) = await replies(ws, 1)
            await send(
                ws,
                [
                    {"session": 0, "type": "step", "data": {}, "id": 2},
                    {"session": 0, "type": "close", "id": 3},
                    {"session": 0, "type": "open", "id": 4},
                    {"session": 0, "type": "step", "data": {}, "id": 5},
                    {"session": 0, "type": "open", "id": 6},
                ],
            )
            got = await replies(ws, 5)
            assert [(r["id"], r["type"]) for r in got] == [
                (2, "observation"),
                (3, "closed"),
                (4, "opened"),
                (5, "observation"),
                (6, "error"),
            ]
            assert got[2]["data"]["session_id"] != first["data"]["session_id"]
            assert got[3]["data"]["observation"]["count"] == 1  # a new environment
            assert "already open" in got[4]["data"]["message"]
            # The same in two frames, sent before any reply is read.
            await send(ws, [{"session": 0, "type": "close", "id": 7}])
            await send(ws, [{"session": 0, "type": "open", "id": 8}])
            got = await replies(ws, 2)
            assert [(r["id"], r["type"]) for r in got] == [(7, "closed"), (8, "opened")]
        finally:
            await ws.close()
        await tracker.until_closed(3)
        await slots_free(url)


async def test_a_slow_session_delays_only_its_own_reply() -> None:
    tracker, gate = Tracker(), threading.Event()
    with run_server(ping_app(tracker, gate=gate)) as url:
        ws = await raw_v2(url)
        try:
            await send(ws, [{"session": k, "type": "open", "id": k} for k in ("slow", "a", "b")])
            assert {r["type"] for r in await replies(ws, 3)} == {"opened"}
            await send(
                ws,
                [
                    {"session": "slow", "type": "step", "data": {"block": True}, "id": 1},
                    {"session": "a", "type": "step", "data": {"message": "x"}, "id": 2},
                    {"session": "b", "type": "step", "data": {"message": "y"}, "id": 3},
                ],
            )
            quick = await replies(ws, 2)
            assert sorted((r["session"], r["id"]) for r in quick) == [("a", 2), ("b", 3)]
            gate.set()
            (late,) = await replies(ws, 1)
            assert (late["session"], late["id"], late["type"]) == ("slow", 1, "observation")
        finally:
            await ws.close()
        await slots_free(url)


async def test_requests_of_one_session_run_in_order() -> None:
    with run_server(ping_app(Tracker())) as url:
        ws = await raw_v2(url)
        try:
            await send(ws, {"session": 0, "type": "open"})
            await replies(ws, 1)
            await send(
                ws,
                [{"session": 0, "type": "step", "data": {"message": m}, "id": m} for m in "abc"]
                + [{"session": 0, "type": "state", "id": "s"}],
            )
            got = await replies(ws, 4)
            assert [r["id"] for r in got] == ["a", "b", "c", "s"]
            assert [r["data"]["observation"]["count"] for r in got[:3]] == [1, 2, 3]
            assert got[3]["data"]["last"] == "c"
        finally:
            await ws.close()


async def test_bad_requests_get_precise_errors_and_the_rest_goes_on() -> None:
    with run_server(ping_app(Tracker(), max_envs=2)) as url:
        ws = await raw_v2(url)
        try:
            await send(ws, "not json")
            (bad,) = await replies(ws, 1)
            assert bad["data"]["code"] == "INVALID_JSON"
            assert "session" not in bad
            await send(ws, '{"a": 1}')
            (bad,) = await replies(ws, 1)
            assert bad["data"]["code"] == "VALIDATION_ERROR"
            assert "'session'" in bad["data"]["message"]
            await send(ws, [{"session": 0, "type": "open", "id": 1}])
            assert (await replies(ws, 1))[0]["type"] == "opened"
            await send(
                ws,
                [
                    {"session": 0, "type": "open", "id": 2},  # already open
                    {"session": 7, "type": "step", "data": {}, "id": 3},  # never opened
                    {"session": 0, "type": "jump", "id": 4},
                    {"session": 0, "type": "step", "data": {"message": 5}, "id": 5},
                    {"session": 0, "type": "step", "data": {"message": "ok"}, "id": 6},
                ],
            )
            got = {r["id"]: r for r in await replies(ws, 5)}
            assert got[2]["data"]["code"] == "VALIDATION_ERROR"
            assert "already open" in got[2]["data"]["message"]
            assert got[3]["data"]["code"] == "SESSION_ERROR"
            assert got[3]["session"] == 7
            assert got[4]["data"]["code"] == "UNKNOWN_TYPE"
            assert got[5]["data"]["code"] == "VALIDATION_ERROR"
            assert got[6]["data"]["observation"]["message"] == "ok"
            # Opening past the cap refuses that session alone.
            await send(ws, [{"session": s, "type": "open", "id": s} for s in (1, 2)])
            opened = {r["id"]: r for r in await replies(ws, 2)}
            assert opened[1]["type"] == "opened"
            assert opened[2]["data"]["code"] == "CAPACITY_REACHED"
            # The name of a closed session is free again.
            await send(ws, [{"session": 1, "type": "close", "id": 9}])
            assert (await replies(ws, 1))[0]["type"] == "closed"
            await send(ws, [{"session": 1, "type": "open", "id": 10}])
            assert (await replies(ws, 1))[0]["type"] == "opened"
        finally:
            await ws.close()
        await slots_free(url)


async def test_a_step_with_a_key_it_does_not_know_is_refused_and_its_neighbours_batched() -> None:
    # A batched step's request keeps its "session" while it is checked: the
    # check counts it, so one key more is still caught, with or without an id.
    with run_server(ping_app(Tracker())) as url:
        ws = await raw_v2(url)
        try:
            await send(ws, [{"session": k, "type": "open", "id": k} for k in (0, 1)])
            await replies(ws, 2)
            await send(
                ws,
                [
                    {"session": 0, "type": "step", "data": {"message": "a"}, "extra": 1},
                    {"session": 1, "type": "step", "data": {"message": "b"}, "id": 2, "x": 0},
                    {"session": 1, "type": "step", "data": {"message": "c"}},
                    {"session": 0, "type": "step", "data": {"message": "d"}, "id": 4},
                ],
            )
            got = await replies(ws, 4)
            errors = [r for r in got if r["type"] == "error"]
            assert sorted(r["session"] for r in errors) == [0, 1]
            assert {r["data"]["code"] for r in errors} == {"VALIDATION_ERROR"}
            stepped = {r["session"]: r for r in got if r["type"] == "observation"}
            assert stepped[1]["data"]["observation"]["message"] == "c"
            assert "id" not in stepped[1]
            assert stepped[0]["data"]["observation"]["message"] == "d"
            assert stepped[0]["id"] == 4
        finally:
            await ws.close()


async def test_too_many_bad_frames_close_the_connection_and_free_its_slots() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_bad_frames=3)) as url:
        ws = await raw_v2(url)
        await send(ws, [{"session": i, "type": "open"} for i in range(2)])
        await replies(ws, 2)
        for _ in range(3):
            await send(ws, "[1, 2")

        async def drain() -> None:
            while True:
                await asyncio.wait_for(ws.recv(), 10)

        with pytest.raises(ConnectionClosed) as closed:
            await drain()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1008
        await slots_free(url)
        await tracker.until_closed(2)


async def test_dropping_a_connection_frees_every_slot_it_held() -> None:
    tracker, gate = Tracker(), threading.Event()
    with run_server(ping_app(tracker, max_envs=60, gate=gate)) as url:
        ws = await raw_v2(url)
        await send(ws, [{"session": i, "type": "open"} for i in range(50)])
        await replies(ws, 50)
        # One step runs on a thread, others wait their turn behind it, an open waits too.
        await send(
            ws,
            [{"session": 0, "type": "step", "data": {"block": True}}]
            + [{"session": 0, "type": "step", "data": {}} for _ in range(5)]
            + [{"session": i, "type": "step", "data": {}} for i in range(1, 50)],
        )
        await replies(ws, 49)
        ws.transport.abort()  # vanish: no close frame
        assert (await health(url))["active_sessions"] == 50  # the blocked step holds its env
        gate.set()
        await slots_free(url)
        await tracker.until_closed(50)
        assert sorted(tracker.closed) == sorted(tracker.created)


async def test_idle_sessions_time_out_one_by_one() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, session_timeout=0.3)) as url:
        async with mux(url) as client:
            busy, idle = await client.open(2)
            await client.reset([busy, idle])
            while not idle.closed:  # the busy one keeps stepping until the idle one is closed
                await busy.step(Ping())
            assert "idle" in idle.closed_because
            with pytest.raises(SessionClosedError):
                await idle.step(Ping())
            assert (await busy.step(Ping())).observation.count > 1
        await slots_free(url)


async def test_a_shutdown_closes_every_session_of_every_connection() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker)) as url:
        client = mux(url)
        sessions = await client.open(5)
        await client.reset(sessions)
    # The server is gone: every session heard of it, every environment is closed.
    await tracker.until_closed(5)
    with pytest.raises(SessionClosedError):
        await sessions[0].step(Ping())
    await client.close()


async def test_fuzzed_frames_never_crash_the_server_or_leak_a_slot() -> None:
    tracker = Tracker()
    rng = random.Random(21)
    keys: list[Any] = [0, 1, 2, "a", -1, 2**53, None, True, 1.5, [], "x" * 300]
    kinds: list[Any] = ["open", "close", "reset", "step", "state", "list_tools", "jump", None, 3]
    datas: list[Any] = [
        {},
        {"message": "m"},
        {"fail": True},
        {"seed": "x"},
        [],
        None,
        "s",
        {"x": [1]},
    ]

    def item() -> Any:
        if rng.random() < 0.05:
            return rng.choice([1, "s", None, [], True])
        out: dict[str, Any] = {}
        for field, values in (("session", keys), ("type", kinds), ("data", datas)):
            if rng.random() < 0.9:
                out[field] = rng.choice(values)
        if rng.random() < 0.5:
            out["id"] = rng.choice([1, "i", None, [], 2.5])
        if rng.random() < 0.05:
            out["extra"] = 1
        return out

    def frame() -> str:
        roll = rng.random()
        if roll < 0.05:
            return rng.choice(["", "[", "{}", "null", "[[[]]]", '"x"', "\x00"])
        if roll < 0.1:
            return orjson.dumps(item()).decode()
        return orjson.dumps([item() for _ in range(rng.randint(0, 12))]).decode()

    with run_server(ping_app(tracker, max_envs=4, max_bad_frames=1000)) as url:
        for _ in range(3):
            ws = await raw_v2(url)
            for _ in range(1000):
                await ws.send(frame())
            # Still serving: a session opened now steps.
            await send(ws, [{"session": "probe", "type": "close"}])
            await send(ws, [{"session": "probe", "type": "open", "id": "p"}])
            while True:
                got = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
                assert isinstance(got, list)
                if any(r.get("id") == "p" for r in got):
                    break
            await ws.close()
            await slots_free(url)
        assert sorted(tracker.closed) == sorted(tracker.created)
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/health")).json()["status"] == "healthy"


async def test_a_session_inside_a_long_step_is_not_reaped_as_idle() -> None:
    tracker, gate = Tracker(), threading.Event()
    with run_server(ping_app(tracker, gate=gate, session_timeout=0.2)) as url:
        async with mux(url) as client:
            stepping, blocked = await client.open(2)
            long_step = asyncio.ensure_future(blocked.step(Ping(block=True)))
            loop = asyncio.get_running_loop()
            until = loop.time() + 1.0  # five idle limits, while the other session steps
            while loop.time() < until:
                await stepping.step(Ping())
            assert not blocked.closed
            gate.set()
            assert (await long_step).observation.count == 1
            assert (await blocked.step(Ping())).observation.count == 2


class AsyncExiting(AsyncPingEnvironment):
    """An ``async def`` step that raises ``SystemExit`` when asked to fail."""

    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        if action.fail:
            raise SystemExit(3)
        return await super().step(action)


class Exiting(PingEnvironment):
    """A plain ``def`` step that raises ``SystemExit`` when asked to fail."""

    def step(self, action: Ping, **kwargs: Any) -> Pong:
        if action.fail:
            raise SystemExit(3)
        return super().step(action)


class AsyncCancelled(AsyncPingEnvironment):
    """An ``async def`` step that awaits a future some other code cancelled."""

    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        if action.fail:
            future = asyncio.get_running_loop().create_future()
            future.cancel()
            await future
        return await super().step(action)


class Cancelled(PingEnvironment):
    """A plain ``def`` step that raises ``CancelledError`` when asked to fail."""

    def step(self, action: Ping, **kwargs: Any) -> Pong:
        if action.fail:
            raise asyncio.CancelledError
        return super().step(action)


@pytest.mark.parametrize("env_cls", [AsyncExiting, Exiting, AsyncCancelled, Cancelled])
async def test_a_step_raising_a_base_exception_ends_only_its_session(
    env_cls: type[PingEnvironment],
) -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, env_cls=env_cls)) as url:
        async with mux(url) as client:
            sessions = await client.open(3)
            results = await client.step(
                sessions, [Ping(), Ping(fail=True), Ping()], return_exceptions=True
            )
            assert isinstance(results[1], SessionError)
            assert sessions[1].closed
            again = await client.step([sessions[0], sessions[2]], [Ping(), Ping()])
            assert [r.observation.count for r in again] == [2, 2]
        await tracker.until_closed(3)
        assert (await health(url))["status"] == "healthy"


async def test_a_call_that_timed_out_leaves_the_session_usable() -> None:
    tracker, gate = Tracker(), threading.Event()
    with run_server(ping_app(tracker, gate=gate)) as url:
        async with mux(url, message_timeout=0.3) as client:
            (session,) = await client.open(1)
            with pytest.raises(EnvTimeoutError):
                await session.step(Ping(block=True, message="slow"))
            gate.set()  # its reply comes late, to nobody; the next call gets its own
            result = await session.step(Ping(message="next"))
            assert (result.observation.message, result.observation.count) == ("next", 2)


async def test_sessions_opened_at_once_from_many_coroutines_share_one_connection() -> None:
    app = ping_app(Tracker(), max_envs=40)
    seen: list[Any] = []

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            seen.append(scope.get("subprotocols"))
        await app(scope, receive, send)

    counting.state = app.state  # type: ignore[attr-defined]
    with run_server(counting) as url:
        client = mux(url)  # not connected yet: the 40 opens race to connect it
        try:
            groups = await asyncio.gather(*(client.open(1) for _ in range(40)))
            results = await asyncio.gather(*(s.step(Ping()) for (s,) in groups))
            assert [r.observation.count for r in results] == [1] * 40
        finally:
            await client.close()
    assert len(seen) == 1


async def test_the_docs_example_runs_against_the_echo_env() -> None:
    docs = Path(__file__).parents[1] / "docs" / "multiplex.md"
    code = re.findall(r"```python\n(.*?)```", docs.read_text(), re.DOTALL)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(docs), "exec"), namespace)
    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=64)
    )
    with run_server(app) as url:
        await namespace["train"](url)
        await slots_free(url)


class AwaitableStep(PingEnvironment):
    """A plain ``def`` step that returns an awaitable when asked ``later``."""

    def step(self, action: Ping, **kwargs: Any) -> Any:  # type: ignore[override]
        async def later() -> Pong:
            await asyncio.sleep(0)
            return PingEnvironment.step(self, action)

        return later() if action.message == "later" else PingEnvironment.step(self, action)


async def test_a_frames_steps_come_back_right_whatever_each_step_returns() -> None:
    # One frame: steps that return, raise, and return an awaitable, each of its
    # own session, in the batch the frame's plain def steps make.
    tracker = Tracker()
    with run_server(ping_app(tracker, env_cls=AwaitableStep)) as url:
        ws = await raw_v2(url)
        try:
            await open_sessions(ws, 4)
            for n in range(1, 3):
                datas = [{"message": "now"}, {"message": "later"}, {"fail": True}, {}]
                await send(ws, steps_of(datas))
                got = {r["session"]: r for r in await replies(ws, 4)}
                assert {k: got[k]["type"] for k in got} == {
                    0: "observation",
                    1: "observation",
                    2: "error",
                    3: "observation",
                }
                assert [got[k]["data"]["observation"]["count"] for k in (0, 1, 3)] == [n] * 3
                assert got[2]["data"]["code"] == "EXECUTION_ERROR"
                assert [got[k]["id"] for k in range(4)] == [0, 1, 2, 3]
        finally:
            await ws.close()
        await slots_free(url)


async def test_batched_steps_keep_their_ids_and_are_counted_in_metrics() -> None:
    # Frame after frame of steps for the same sessions: every reply carries its
    # own request's id and count, and /metrics counts each step and error once.
    from prometheus_client.parser import text_string_to_metric_families

    tracker = Tracker()
    with run_server(ping_app(tracker)) as url:
        ws = await raw_v2(url)
        try:
            await open_sessions(ws, 3)
            for n in range(1, 6):
                steps = [
                    {
                        "session": k,
                        "type": "step",
                        "data": {"message": f"{n}/{k}"},
                        "id": 10 * n + k,
                    }
                    for k in range(3)
                ]
                steps.append({"session": 2, "type": "step", "data": {"fail": True}, "id": "bad"})
                await send(ws, steps)
                got = await replies(ws, 4)
                ok = {r["session"]: r for r in got if r["type"] == "observation"}
                assert {k: ok[k]["id"] for k in ok} == {k: 10 * n + k for k in range(3)}
                assert {k: ok[k]["data"]["observation"]["message"] for k in ok} == {
                    k: f"{n}/{k}" for k in range(3)
                }
                assert {k: ok[k]["data"]["observation"]["count"] for k in ok} == {0: n, 1: n, 2: n}
                [error] = [r for r in got if r["type"] == "error"]
                assert (error["session"], error["id"], error["data"]["code"]) == (
                    2,
                    "bad",
                    "EXECUTION_ERROR",
                )
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"{url}/metrics")).text
        finally:
            await ws.close()
        await slots_free(url)
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels or s.labels == {"code": "EXECUTION_ERROR"}
    }
    assert values["openenv_steps_total"] == 15
    assert values["openenv_step_seconds_count"] == 15
    assert values["openenv_errors_total"] == 5


class Odd(Pong):
    value: Any = None


class OddForOrjson(Odd):
    dump_mode = "python"  # fields go to orjson as they are: it refuses both odd values


class OddObservations(PingEnvironment):
    """A plain ``def`` step whose observation cannot be sent when asked: an int
    past what JSON encoders take (``big``), or an object pydantic cannot dump."""

    observation: type[Odd] = Odd

    def step(self, action: Ping, **kwargs: Any) -> Any:  # type: ignore[override]
        pong = PingEnvironment.step(self, action)
        value = {"big": 2**70, "object": object()}.get(action.message)
        return self.observation(message=pong.message, count=pong.count, value=value)


class OddObservationsForOrjson(OddObservations):
    observation = OddForOrjson


@pytest.mark.parametrize("env_cls", [OddObservations, OddObservationsForOrjson])
async def test_an_observation_that_cannot_be_sent_ends_only_its_session(
    env_cls: type[OddObservations],
) -> None:
    # One frame whose batch holds steps that can be sent and two that cannot:
    # those two sessions end with SESSION_ERROR, the others are answered, and
    # go on stepping; every slot comes back.
    tracker = Tracker()
    with run_server(ping_app(tracker, env_cls=env_cls)) as url:
        ws = await raw_v2(url)
        try:
            await open_sessions(ws, 4)
            messages = ["fine", "big", "object", "also fine"]
            await send(ws, steps_of([{"message": m} for m in messages]))
            got = await replies(ws, 6)  # four replies, and a closed notice for each that ended
            by_kind: dict[str, dict[int, dict[str, Any]]] = {}
            for reply in got:
                by_kind.setdefault(reply["type"], {})[reply["session"]] = reply
            assert sorted(by_kind["observation"]) == [0, 3]
            assert by_kind["observation"][3]["data"]["observation"]["message"] == "also fine"
            assert sorted(by_kind["error"]) == [1, 2]
            assert {by_kind["error"][k]["data"]["code"] for k in (1, 2)} == {"SESSION_ERROR"}
            assert [by_kind["error"][k]["id"] for k in (1, 2)] == [1, 2]
            assert sorted(by_kind["closed"]) == [1, 2]
            await send(ws, [{"session": k, "type": "step", "data": {}, "id": 9} for k in (0, 3)])
            again = await replies(ws, 2)
            assert {
                (r["session"], r["type"], r["data"]["observation"]["count"]) for r in again
            } == {
                (0, "observation", 2),
                (3, "observation", 2),
            }
            await servers.until(
                lambda: _active_is(url, 2), what="the two ended sessions' slots freed"
            )
        finally:
            await ws.close()
        await slots_free(url)


async def _active_is(url: str, count: int) -> bool:
    return bool((await health(url))["active_sessions"] == count)


class Shouted(Pong):
    """Another class in the same batch, with a serializer of its own."""

    @field_serializer("message")
    def _loud(self, message: str) -> str:
        return message.upper()


class Scored(Pong):
    """And one dumped in pydantic's python mode, with a field of its own."""

    dump_mode = "python"
    score: float = 0.0


class MixedObservations(PingEnvironment):
    """A plain ``def`` step whose observation's class is named by the message."""

    def step(self, action: Ping, **kwargs: Any) -> Any:  # type: ignore[override]
        pong = PingEnvironment.step(self, action)
        cls = {"shout": Shouted, "score": Scored}.get(action.message, Pong)
        return cls(message=pong.message, count=pong.count, reward=0.5, done=cls is Scored)


async def test_a_batch_of_observations_of_many_classes_dumps_each_by_its_own() -> None:
    # One frame's batch returns observations of three classes, in runs and
    # alone: each reply is what v1 sends for that observation, dumped by its
    # own class's serializer (a batch looks a class's serializer up once a run).
    tracker = Tracker()
    messages = ["plain", "shout", "shout", "plain", "score", "score", "shout", "plain"]
    with run_server(ping_app(tracker, env_cls=MixedObservations)) as url:
        ws = await raw_v2(url)
        try:
            await open_sessions(ws, len(messages))
            await send(ws, steps_of([{"message": m} for m in messages]))
            got = {r["session"]: r for r in await replies(ws, len(messages))}
        finally:
            await ws.close()
        await slots_free(url)
    for key, message in enumerate(messages):
        cls = {"shout": Shouted, "score": Scored}.get(message, Pong)
        sent = cls(message=message, count=1, reward=0.5, done=cls is Scored)
        expected = orjson.loads(protocol.observation_frame(sent, key))
        assert {k: v for k, v in got[key].items() if k != "session"} == expected
    assert got[1]["data"]["observation"]["message"] == "SHOUT"
    assert got[4]["data"]["observation"] == {"message": "score", "count": 1, "score": 0.0}
