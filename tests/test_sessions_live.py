"""Sessions against a real uvicorn server on loopback, through real WebSocket clients."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import httpx
import orjson
import pytest
from servers import (
    AsyncPingEnvironment,
    Ping,
    PingEnvironment,
    Pong,
    Tracker,
    ping_app,
    slots_free,
)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from echo_env import EchoAction, EchoEnv
from openenv import (
    CapacityError,
    EnvExecutionError,
    Environment,
    EnvValidationError,
    SessionClosedError,
    State,
    WebSocketEnvClient,
    create_app,
)
from openenv.client import ws_url
from openenv.testing import run_server


def ping_client(url: str, **options: object) -> WebSocketEnvClient:
    return WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong, **options)  # type: ignore[arg-type]


async def raw_exchange(ws: object, frame: str | dict[str, object]) -> dict[str, object]:
    text = frame if isinstance(frame, str) else orjson.dumps(frame).decode()
    await ws.send(text)  # type: ignore[attr-defined]
    reply: dict[str, object] = orjson.loads(await ws.recv())  # type: ignore[attr-defined]
    return reply


async def test_full_episode_through_typed_async_client(echo_url: str) -> None:
    async with EchoEnv(echo_url) as env:
        first = await env.reset(seed=7, episode_id="ep-1")
        assert first.observation.echoed_message == ""
        assert first.done is False
        rewards = []
        result = first
        for i in range(50):
            result = await env.step(EchoAction(message="x" * (i % 5 + 1)))
            rewards.append(result.reward)
            assert result.observation.message_length == i % 5 + 1
        state = await env.state()
    assert result.done is True
    assert rewards[:5] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert isinstance(state, State)
    assert state.episode_id == "ep-1"
    assert state.step_count == 50


def test_full_episode_through_sync_client(echo_url: str) -> None:
    with EchoEnv(echo_url).sync() as env:
        env.reset()
        result = env.step(EchoAction(message="hello"))
        assert result.observation.echoed_message == "hello"
        assert result.reward == 0.5
        assert env.state().step_count == 1


async def test_sync_client_works_inside_a_running_event_loop(echo_url: str) -> None:
    # A notebook cell runs inside a loop; the blocking client must not deadlock there.
    with EchoEnv(echo_url).sync() as env:
        assert env.reset().observation.message_length == 0


async def test_concurrent_sessions_keep_independent_state(echo_url: str) -> None:
    async with EchoEnv(echo_url) as a, EchoEnv(echo_url) as b:
        await asyncio.gather(a.reset(episode_id="a"), b.reset(episode_id="b"))
        for _ in range(3):
            await a.step(EchoAction(message="a"))
        await b.step(EchoAction(message="b"))
        state_a, state_b = await asyncio.gather(a.state(), b.state())
    assert (state_a.episode_id, state_a.step_count) == ("a", 3)
    assert (state_b.episode_id, state_b.step_count) == ("b", 1)


async def test_capacity_reached_then_slot_reusable_after_close() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2)) as url:
        first, second = ping_client(url), ping_client(url)
        await first.reset()
        await second.reset()
        async with connect(ws_url(url)) as ws:
            error = orjson.loads(await ws.recv())
            assert error["type"] == "error"
            assert error["data"]["code"] == "CAPACITY_REACHED"
            assert error["data"]["active_sessions"] == 2
            assert error["data"]["max_sessions"] == 2
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1013
        with pytest.raises(CapacityError) as refused:
            await ping_client(url).reset()
        assert refused.value.max_sessions == 2
        await first.close()
        third = ping_client(url)
        assert (await third.reset()).observation.message == "reset:None"
        await asyncio.gather(second.close(), third.close())
    # Refused connections never created an environment.
    assert len(tracker.created) == 3


async def test_client_that_vanishes_frees_its_slot() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=1)) as url:
        ws = await connect(ws_url(url))
        await raw_exchange(ws, {"type": "reset"})
        ws.transport.abort()  # no close frame: the peer just disappears
        await tracker.until_closed(1)
        await slots_free(url)
        async with ping_client(url) as client:
            assert (await client.step(Ping(message="again"))).observation.count == 1


async def test_idle_session_is_reaped_and_its_environment_closed() -> None:
    tracker = Tracker()
    app = ping_app(tracker, max_envs=1, session_timeout=0.2, reap_interval=0.05)
    with run_server(app) as url:
        async with connect(ws_url(url)) as ws:
            await raw_exchange(ws, {"type": "reset"})
            error = orjson.loads(await ws.recv())  # arrives unprompted once idle
            assert error["data"]["code"] == "SESSION_ERROR"
            assert "idle" in error["data"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1001
        await tracker.until_closed(1)
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/health")).json()["active_sessions"] == 0


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("this is not json", "INVALID_JSON"),
        ("[1, 2, 3]", "INVALID_JSON"),
        ({"type": "jump", "data": {}}, "UNKNOWN_TYPE"),
        ({"data": {}}, "UNKNOWN_TYPE"),
        ({"type": "step", "data": {"message": 42}}, "VALIDATION_ERROR"),
        ({"type": "step", "data": {"bogus": 1}}, "VALIDATION_ERROR"),
        ({"type": "step", "data": "not an object"}, "VALIDATION_ERROR"),
        ({"type": "step"}, "VALIDATION_ERROR"),
        ({"type": "reset", "data": {"seed": "abc"}}, "VALIDATION_ERROR"),
        ({"type": "reset", "data": {"level": 3}}, "VALIDATION_ERROR"),
        ({"type": "step", "data": {"fail": True}}, "EXECUTION_ERROR"),
    ],
)
async def test_non_fatal_errors_leave_the_session_usable(
    frame: str | dict[str, object], code: str
) -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=1)) as url:
        async with connect(ws_url(url)) as ws:
            await raw_exchange(ws, {"type": "reset"})
            await raw_exchange(ws, {"type": "step", "data": {"message": "before"}})
            error = await raw_exchange(ws, frame)
            assert error["type"] == "error"
            assert error["data"]["code"] == code  # type: ignore[index]
            assert "Traceback" not in error["data"]["message"]  # type: ignore[index]
            reply = await raw_exchange(ws, {"type": "step", "data": {"message": "after"}})
            assert reply["type"] == "observation"
            assert reply["data"]["observation"] == {"message": "after", "count": 2}  # type: ignore[index]


async def test_errors_raise_typed_exceptions_with_details() -> None:
    with run_server(ping_app(Tracker(), max_envs=1)) as url:
        async with ping_client(url) as client:
            await client.reset()
            with pytest.raises(EnvValidationError) as invalid:
                await client.step({"message": 42})
            assert invalid.value.errors[0]["loc"] == ["message"]
            # The type reaches the client; the text, which may hold secrets, does not.
            with pytest.raises(EnvExecutionError, match=r"step\(\) raised ValueError \(") as failed:
                await client.step(Ping(fail=True))
            assert "asked to fail" not in str(failed.value)
            assert (await client.step(Ping(message="ok"))).observation.message == "ok"


async def test_factory_error_is_fatal_and_frees_the_slot() -> None:
    def broken() -> PingEnvironment:
        raise RuntimeError("no GPU today")

    app = create_app(broken, Ping, Pong)
    with run_server(app) as url:
        for _ in range(2):  # the slot comes back each time
            async with connect(ws_url(url)) as ws:
                error = orjson.loads(await ws.recv())
                assert error["data"]["code"] == "FACTORY_ERROR"
                assert "RuntimeError" in error["data"]["message"]
                assert "no GPU today" not in error["data"]["message"]
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 1011
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/health")).json()["active_sessions"] == 0


async def test_every_environment_is_closed_exactly_once() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=8)) as url:
        clean = [ping_client(url) for _ in range(3)]
        for client in clean:
            await client.reset()
        vanishing = [await connect(ws_url(url)) for _ in range(2)]
        for ws in vanishing:
            await raw_exchange(ws, {"type": "reset"})
        left_open = [ping_client(url) for _ in range(2)]
        for client in left_open:
            await client.reset()
        for client in clean:
            await client.close()
            await client.close()  # a second close is a no-op
        for ws in vanishing:
            ws.transport.abort()
        await tracker.until_closed(5)
    # Leaving the server context shut it down, closing the two sessions left open.
    assert len(tracker.created) == 7
    assert sorted(tracker.closed) == sorted(tracker.created)


async def test_slow_sync_step_does_not_delay_other_sessions() -> None:
    gate = threading.Event()
    with run_server(ping_app(Tracker(), max_envs=2, gate=gate)) as url:
        async with ping_client(url) as slow, ping_client(url) as fast:
            await asyncio.gather(slow.reset(), fast.reset())
            blocked = asyncio.create_task(slow.step(Ping(block=True)))
            for i in range(20):
                assert (await fast.step(Ping(message=str(i)))).observation.count == i + 1
            # The fast session finished all its steps while the slow one still waits.
            assert not blocked.done()
            gate.set()
            assert (await blocked).observation.count == 1


async def test_async_environment_methods_run_on_the_loop() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, env_cls=AsyncPingEnvironment)) as url:
        async with ping_client(url) as client:
            assert (await client.reset(seed=3)).observation.message == "reset:3"
            assert (await client.reset(difficulty=2)).observation.message == "reset:None:2"
            assert (await client.step(Ping(message="a"))).observation.count == 1
            with pytest.raises(EnvExecutionError, match="do not block"):
                await client.step(Ping(block=True))
    assert len(tracker.closed) == 1


async def test_request_id_is_echoed() -> None:
    with run_server(ping_app(Tracker())) as url:
        async with connect(ws_url(url)) as ws:
            reply = await raw_exchange(ws, {"type": "reset", "data": {"seed": 1}, "id": "r-1"})
            assert (reply["type"], reply["id"]) == ("observation", "r-1")
            reply = await raw_exchange(ws, {"type": "step", "data": {}, "id": 42})
            assert (reply["type"], reply["id"]) == ("observation", 42)
            reply = await raw_exchange(ws, {"type": "state", "id": 43})
            assert (reply["type"], reply["id"]) == ("state", 43)
            reply = await raw_exchange(ws, {"type": "nope", "id": 44})
            assert (reply["type"], reply["id"]) == ("error", 44)
            reply = await raw_exchange(ws, {"type": "step", "data": {"fail": True}, "id": 45})
            assert (reply["type"], reply["id"]) == ("error", 45)
            reply = await raw_exchange(ws, {"type": "state"})
            assert "id" not in reply


async def test_openenv_style_frames_round_trip(echo_url: str) -> None:
    # Exactly the frames OpenEnv's client sends, and the reply shape it parses.
    async with connect(ws_url(echo_url)) as ws:
        reply = await raw_exchange(ws, {"type": "reset", "data": {}})
        assert set(reply) == {"type", "data"}
        assert set(reply["data"]) == {"observation", "reward", "done"}  # type: ignore[arg-type]
        reply = await raw_exchange(ws, {"type": "step", "data": {"message": "hey"}})
        assert reply["data"] == {
            "observation": {"echoed_message": "hey", "message_length": 3},
            "reward": 0.3,
            "done": False,
        }
        reply = await raw_exchange(ws, {"type": "state"})
        assert reply["type"] == "state"
        assert reply["data"]["step_count"] == 1  # type: ignore[index]
        await ws.send(orjson.dumps({"type": "close"}).decode())
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1000


async def test_server_shutdown_ends_open_sessions() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker)) as url:
        client = ping_client(url)
        await client.reset()
    await tracker.until_closed(1)
    with pytest.raises(SessionClosedError) as ended:
        await client.step(Ping())
    # uvicorn closes open WebSockets with 1012 (service restart) as it stops.
    assert ended.value.close_code in {1001, 1012}


async def test_only_a_close_the_environment_defines_runs_on_a_worker_thread() -> None:
    # Environment.close() does nothing: a session of an environment that keeps
    # it ends without a thread hop. One that overrides it still gets its call.
    class NothingToClose(PingEnvironment):
        close = Environment.close  # type: ignore[assignment]

    for env_cls, closes in ((NothingToClose, 0), (PingEnvironment, 1)):
        app = ping_app(Tracker(), env_cls=env_cls)
        service = app.state.openenv  # type: ignore[attr-defined]
        submitted: list[str] = []
        submit = service.handoff.submit

        def recording(
            ticket: object,
            fn: object,
            *rest: object,
            _submit: object = submit,
            _submitted: list[str] = submitted,
            **options: object,
        ) -> object:
            _submitted.append(getattr(fn, "__name__", ""))
            return _submit(ticket, fn, *rest, **options)  # type: ignore[operator]

        service.handoff.submit = recording
        with run_server(app) as url:
            async with ping_client(url) as env:
                await env.reset()
            await slots_free(url)
        assert "reset" in submitted
        assert submitted.count("close") == closes, (env_cls.__name__, submitted)


async def test_one_app_on_two_servers_shares_its_cap_and_each_server_drains_its_own() -> None:
    # A test's fixture and a test may serve the same app object at once: one
    # cap for both, and the server that stops first (here the one started
    # first) ends only its own sessions; the other keeps serving.
    tracker = Tracker()
    app = ping_app(tracker, max_envs=2)
    first_server, second_server = contextlib.ExitStack(), contextlib.ExitStack()
    with second_server:
        with first_server:
            first_url = first_server.enter_context(run_server(app))
            second_url = second_server.enter_context(run_server(app))
            on_first, on_second = ping_client(first_url), ping_client(second_url)
            await on_first.reset()
            await on_second.reset()
            with pytest.raises(CapacityError):
                await ping_client(first_url).reset()
        with pytest.raises(SessionClosedError):
            await on_first.step(Ping())
        assert (await on_second.step(Ping(message="still here"))).observation.count == 1
        newcomer = ping_client(second_url)  # the slot the first server's session held
        await newcomer.reset()
        assert (await newcomer.step(Ping())).observation.count == 1
        await asyncio.gather(on_second.close(), newcomer.close())
    await tracker.until_closed(3)
    # Served again after both have stopped.
    with run_server(app) as url:
        again = ping_client(url)
        await again.reset()
        await again.close()


async def test_a_start_that_fails_leaves_the_app_ready_to_be_served_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slot board that cannot be made (its folder is a file) fails the start,
    # and the caller hears of it; the app is then served as if new, and its
    # shutdown lets go of everything (no server left on its books).
    not_a_folder = tmp_path / "board"
    not_a_folder.write_text("")
    tracker = Tracker()
    app = ping_app(tracker)
    service = app.state.openenv
    monkeypatch.setenv("OPENENV_SLOT_BOARD", str(not_a_folder))
    with pytest.raises(RuntimeError, match="exited during startup"), run_server(app):
        pass  # pragma: no cover - the server never starts
    assert service.loops == frozenset()
    monkeypatch.delenv("OPENENV_SLOT_BOARD")
    with run_server(app) as url:
        assert len(service.loops) == 1
        client = ping_client(url)
        await client.reset()
        assert (await client.step(Ping())).observation.count == 1
    await tracker.until_closed(1)
    assert service.loops == frozenset()
