"""The v2 client (``MuxClient``) against a server that fails it: a connection cut
while a batch is out, replies that are not the protocol, replies for nobody, a
server that never answers, a step that hangs while the client closes. Every
waiting call hears of it at once, with a precise error; nothing hangs, and the
server frees every slot it held."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from servers import Held, Hold, Holding, Ping, PingEnvironment, Pong, Tracker, ping_app, slots_free
from tcp_proxy import TcpProxy
from websockets.asyncio.server import ServerConnection, serve

from openenv import (
    ConcurrencyConfig,
    EnvTimeoutError,
    MuxClient,
    SessionClosedError,
    State,
    create_app,
)
from openenv.protocol_v2 import SUBPROTOCOL
from openenv.testing import run_server


def client(url: str, **options: Any) -> MuxClient[Hold, Held, State]:
    return MuxClient(url, action_cls=Hold, observation_cls=Held, **options)


async def test_a_connection_cut_while_a_batch_is_out_fails_each_of_its_steps() -> None:
    holding = Holding(max_envs=4)
    with run_server(holding.app) as url, TcpProxy(url) as proxy:
        # No message timeout: only the cut can end the wait.
        mux = client(proxy.url, message_timeout=None, ping_interval=None)
        sessions = await mux.open(4)
        await mux.reset(sessions)
        batch = asyncio.ensure_future(
            mux.step(sessions, [Hold(wait=True)] * 4, return_exceptions=True)
        )
        await holding.until_entered(4)  # every step is running on the server
        assert proxy.cut() == 1
        results = await batch
        assert [type(r) for r in results] == [SessionClosedError] * 4
        assert mux.closed
        assert all(s.closed for s in sessions)
        with pytest.raises(SessionClosedError):
            await sessions[0].step(Hold())
        with pytest.raises(SessionClosedError):
            await mux.open(1)
        await mux.close()
        holding.gate.set()
        await slots_free(url)


Handler = Callable[[ServerConnection], Awaitable[None]]


@asynccontextmanager
async def fake_v2_server(handler: Handler) -> AsyncIterator[str]:
    """A WebSocket server that speaks v2's subprotocol and nothing else of it."""
    async with serve(handler, "127.0.0.1", 0, subprotocols=[SUBPROTOCOL]) as server:  # type: ignore[list-item]
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}"


def opened(requests: list[dict[str, Any]]) -> str | None:
    """The reply to a frame that only opens sessions: each opened; else ``None``."""
    if not all(r["type"] == "open" for r in requests):
        return None
    replies = [
        {**r, "type": "opened", "data": {"session_id": f"s{r['session']}"}} for r in requests
    ]
    return orjson.dumps(replies).decode()


def opens_then(answer: Callable[[list[dict[str, Any]]], str | None]) -> Handler:
    """A handler that opens every session asked for, then sends ``answer(requests)``
    for each later frame (``None``: no answer), reading on until the client leaves."""

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            requests = orjson.loads(frame)
            reply = opened(requests) or answer(requests)
            if reply is not None:
                await ws.send(reply)

    return handler


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        '{"session": 0}',  # an object, not an array
        "[1, 2]",  # items that are not replies
        '[{"session": 0, "type": "closed"}]',  # a notice without its data
    ],
)
async def test_a_reply_frame_that_is_not_the_protocol_fails_every_waiting_call(
    frame: str,
) -> None:
    async with fake_v2_server(opens_then(lambda _: frame)) as url:
        mux = client(url, message_timeout=None)
        sessions = await mux.open(3)
        with pytest.raises(SessionClosedError, match="the connection failed"):
            await mux.step(sessions, [Hold()] * 3)
        assert mux.closed
        with pytest.raises(SessionClosedError, match="the connection failed"):
            await sessions[1].step(Hold())
        await mux.close()


@pytest.mark.parametrize(
    "frame",
    [
        # A v1 reply: a server that took the v2 subprotocol but speaks v1.
        '{"type": "observation", "data": {"observation": {}, "reward": 1.0, "done": false}}',
        "[1, 2]",
    ],
)
async def test_a_reply_frame_that_is_not_an_array_of_replies_is_named_so(frame: str) -> None:
    async with fake_v2_server(opens_then(lambda _: frame)) as url:
        mux = client(url, message_timeout=None)
        sessions = await mux.open(2)
        with pytest.raises(SessionClosedError, match="not a JSON array of objects") as caught:
            await sessions[0].step(Hold())
        assert frame[:40] in str(caught.value)
        await mux.close()


CLOSED_WITHOUT_WHY = {
    "no data": {},
    "data not an object": {"data": "idle"},
    "no message nor reason": {"data": {"code": 1000}},
}


@pytest.mark.parametrize("notice", [True, False], ids=["a notice", "a reply"])
@pytest.mark.parametrize("bad", CLOSED_WITHOUT_WHY.values(), ids=CLOSED_WITHOUT_WHY.keys())
async def test_a_closed_that_says_no_reason_is_named_so(notice: bool, bad: dict[str, Any]) -> None:
    # A hostile or broken server: the session's end, without why.
    def answer(requests: list[dict[str, Any]]) -> str:
        first = requests[0]
        closed = {"session": first["session"], "type": "closed", **bad}
        return orjson.dumps([closed if notice else {**closed, "id": first["id"]}]).decode()

    async with fake_v2_server(opens_then(answer)) as url:
        mux = client(url, message_timeout=None)  # only the reply can end the wait
        sessions = await mux.open(2)
        async with asyncio.timeout(30):
            with pytest.raises(SessionClosedError, match="the connection failed") as caught:
                await mux.step(sessions, [Hold()] * 2)
        assert "a 'closed' without a message or reason in its data" in str(caught.value)
        assert "'type': 'closed'" in str(caught.value)  # the reply itself, to look into
        assert mux.closed
        await mux.close()


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("error", {"code": "RATE_LIMITED", "message": "slow down"}),  # a code it does not know
        ("error", {"message": "no code"}),
        ("closed", {}),  # no reason
    ],
)
async def test_a_malformed_reply_to_a_waiting_call_fails_it_at_once(
    kind: str, data: dict[str, Any]
) -> None:
    def answer(requests: list[dict[str, Any]]) -> str:
        replies = [
            {"session": r["session"], "id": r["id"], "type": kind, "data": data} for r in requests
        ]
        return orjson.dumps(replies).decode()

    async with fake_v2_server(opens_then(answer)) as url:
        mux = client(url, message_timeout=None)  # only the reply can end the wait
        sessions = await mux.open(2)
        async with asyncio.timeout(30):
            with pytest.raises(SessionClosedError, match="the connection failed"):
                await mux.step(sessions, [Hold()] * 2)
        assert mux.closed
        await mux.close()


async def test_an_opened_reply_without_its_session_id_fails_the_open_at_once() -> None:
    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            replies = [{**r, "type": "opened", "data": {}} for r in orjson.loads(frame)]
            await ws.send(orjson.dumps(replies).decode())

    async with fake_v2_server(handler) as url:
        mux = client(url, message_timeout=None)
        async with asyncio.timeout(30):
            with pytest.raises(SessionClosedError, match="the connection failed"):
                await mux.open(2)
        await mux.close()


@pytest.mark.parametrize("code", [1000, 1001])
async def test_a_normal_close_with_a_reason_is_told_to_every_waiting_call(code: int) -> None:
    # 1000 and 1001 (a server or a proxy going away) are the close codes that
    # end the connection cleanly: the reason must reach the caller all the same.
    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            reply = opened(orjson.loads(frame))
            if reply is not None:
                await ws.send(reply)
            else:
                await ws.close(code, "replica drained for maintenance")

    async with fake_v2_server(handler) as url:
        mux = client(url, message_timeout=None)  # only the close can end the waits
        sessions = await mux.open(3)
        async with asyncio.timeout(30):
            results = await asyncio.gather(
                mux.step(sessions[:2], [Hold()] * 2),
                sessions[2].step(Hold()),
                return_exceptions=True,
            )
        for failure in results:
            assert isinstance(failure, SessionClosedError)
            assert failure.reason == "replica drained for maintenance"
            assert failure.close_code == code
        with pytest.raises(SessionClosedError, match="replica drained for maintenance"):
            await mux.open(1)
        await mux.close()


@pytest.mark.parametrize("kind", ["observation", "closed"])
async def test_a_reply_naming_another_session_than_its_requests_fails_the_connection(
    kind: str,
) -> None:
    data = {
        "observation": {"observation": {"steps": 1}, "reward": 1.0, "done": False},
        "closed": {"reason": "client_close", "code": 1000, "message": ""},
    }[kind]

    def answer(requests: list[dict[str, Any]]) -> str:
        # Each reply carries its request's id but the next session's name.
        replies = [
            {"session": r["session"] + 1, "id": r["id"], "type": kind, "data": data}
            for r in requests
        ]
        return orjson.dumps(replies).decode()

    async with fake_v2_server(opens_then(answer)) as url:
        mux = client(url, message_timeout=None)
        sessions = await mux.open(3)
        async with asyncio.timeout(30):
            with pytest.raises(
                SessionClosedError, match="a reply for session 1 to a request of session 0"
            ):
                await sessions[0].step(Hold())
        assert mux.closed
        assert all(s.closed for s in sessions)
        await mux.close()


async def test_replies_for_no_waiting_request_are_passed_over() -> None:
    def answer(requests: list[dict[str, Any]]) -> str:
        stray = [
            {"session": 99, "type": "observation", "data": {}, "id": 10_000},  # nobody's
            {"session": 0, "type": "error", "data": {"code": "X", "message": "?"}},  # no id
            {"session": 0, "type": "observation", "data": {}, "id": None},
        ]
        real = [
            {
                "session": r["session"],
                "type": "observation",
                "data": {"observation": {"steps": 7}, "reward": 1.0, "done": False},
                "id": r["id"],
            }
            for r in requests
        ]
        return orjson.dumps(stray + real[::-1]).decode()  # in any order

    server = fake_v2_server(opens_then(answer))
    async with server as url, client(url, message_timeout=None) as mux:
        sessions = await mux.open(3)
        results = await mux.step(sessions, [Hold()] * 3)
        assert [r.observation.steps for r in results] == [7, 7, 7]
        assert not mux.closed


async def test_a_server_that_never_answers_times_out_the_batch_and_closing_is_bounded() -> None:
    async with fake_v2_server(opens_then(lambda _: None)) as url:
        mux = client(url)
        sessions = await mux.open(2)
        mux.message_timeout = 0.2  # from here on, when nothing is answered
        with pytest.raises(EnvTimeoutError, match=r"no reply to 2 requests within 0\.2s"):
            await mux.step(sessions, [Hold()] * 2)
        with pytest.raises(EnvTimeoutError, match=r"no reply to 'step' within 0\.2s"):
            await sessions[0].step(Hold())
        # Closing asks the server to close each session, which it never answers
        # either: the client gives up after its message timeout and closes the socket.
        await mux.close()
        assert mux.closed


async def test_closing_while_a_step_hangs_returns_and_the_server_frees_the_slots_later() -> None:
    holding = Holding(max_envs=2)
    with run_server(holding.app) as url:
        # No message timeout: closing must not wait on the hung step's reply for ever.
        mux = client(url, message_timeout=None)
        stuck, idle = await mux.open(2)
        await mux.reset([stuck, idle])
        mux.connect_timeout = 0.2  # what close() waits for its sessions' replies
        step = asyncio.ensure_future(stuck.step(Hold(wait=True)))
        await holding.until_entered()
        await asyncio.wait_for(mux.close(), 30)  # a bound for the test, not the behaviour
        with pytest.raises(SessionClosedError):
            await step
        assert stuck.closed
        assert idle.closed
        holding.gate.set()  # the step ends; the server closes its session and frees both slots
        await slots_free(url)


async def test_closing_when_the_server_stopped_reading_is_bounded_by_connect_timeout() -> None:
    tracker = Tracker()
    app = create_app(functools.partial(PingEnvironment, tracker), Ping, Pong)
    # No pings either way: only the client's own limits can end its waits.
    with run_server(app, ws_ping_interval=None) as url:
        with TcpProxy(url) as proxy:
            mux = MuxClient(
                proxy.url,
                action_cls=Ping,
                observation_cls=Pong,
                message_timeout=0.5,
                connect_timeout=1,
                ping_interval=None,
            )
            (session,) = await mux.open(1)
            await session.reset()
            proxy.stop_reading()
            async with asyncio.timeout(60):  # a guard: without the limit close() waits for ever
                with pytest.raises(EnvTimeoutError):
                    # Larger than every buffer on the way (loopback's grow to 32 MiB).
                    await session.step(Ping(message="x" * 64_000_000))
                await mux.close()
            assert mux.closed
        await tracker.until_closed(1)  # the proxy cut the server's side on exit
        await slots_free(url)


async def test_a_session_opened_after_its_caller_gave_up_is_closed_again() -> None:
    tracker = Tracker()
    one_slot = ConcurrencyConfig(max_concurrent_envs=1, queue_timeout=30)
    app = create_app(functools.partial(PingEnvironment, tracker, None), Ping, Pong, one_slot)
    with run_server(app) as url:
        async with MuxClient(url, action_cls=Ping, observation_cls=Pong) as holder:
            await holder.open(1)
            late = MuxClient(url, action_cls=Ping, observation_cls=Pong, message_timeout=0.2)
            with pytest.raises(EnvTimeoutError):
                await late.open(1)  # in line for the one slot
            late.message_timeout = 60
        # The holder left: the session in line opens, for a client that gave up on it,
        # which closes it at once rather than hold the slot while it lives.
        await tracker.until_created(2)
        await tracker.until_closed(2)
        await slots_free(url)
        (session,) = await late.open(1)  # the client goes on
        assert (await session.step(Ping())).observation.count == 1
        await late.close()


async def test_a_batch_larger_than_a_frame_may_carry_goes_out_in_several() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2)) as url:
        async with MuxClient(url, action_cls=Ping, observation_cls=Pong) as mux:
            (env,) = await mux.open(1)
            count = 4096 + 10  # past max_requests_in_flight: one frame of them is refused
            results = await mux.step([env] * count, [Ping()] * count)
            assert [r.observation.count for r in results] == list(range(1, count + 1))
        await slots_free(url)


async def test_a_frame_the_server_refuses_whole_fails_its_calls_at_once() -> None:
    # A server that takes fewer requests in a frame than a batch holds: which
    # calls the refused frame held is not said, and none of them will run.
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=32, max_requests_in_flight=16)) as url:
        mux = MuxClient(url, action_cls=Ping, observation_cls=Pong, message_timeout=None)
        async with asyncio.timeout(30):  # not a wait for replies that never come
            with pytest.raises(SessionClosedError, match="at most 16 requests"):
                await mux.open(20)
        assert mux.closed
        await mux.close()
        await slots_free(url)
