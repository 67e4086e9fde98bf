"""Frame size, bad-frame and pipelining limits, heartbeats, and the admission queue."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import os
import socket

import orjson
import pytest
from servers import Ping, PingEnvironment, Pong, Tracker, health, slots_free, until
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from openenv import (
    CapacityError,
    ConcurrencyConfig,
    SessionClosedError,
    WebSocketEnvClient,
    create_app,
)
from openenv.client import ws_url
from openenv.testing import run_server


def client(url: str, **options: object) -> WebSocketEnvClient:
    return WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong, **options)  # type: ignore[arg-type]


def tracked_app(tracker: Tracker, max_envs: int = 1, **settings: object) -> object:
    queue_timeout = settings.pop("queue_timeout", 0)
    return create_app(
        functools.partial(PingEnvironment, tracker),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=max_envs, queue_timeout=queue_timeout),  # type: ignore[arg-type]
        **settings,
    )


async def _closed_with(ws: object) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        await ws.recv()  # type: ignore[attr-defined]
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


async def test_oversized_frame_gets_1009_and_nothing_else() -> None:
    tracker = Tracker()
    with run_server(tracked_app(tracker, max_message_size=1024)) as url:
        async with connect(ws_url(url)) as ws:
            await ws.send(orjson.dumps({"type": "step", "data": {"message": "x" * 2000}}).decode())
            assert await _closed_with(ws) == 1009  # no reply frame came first
        await tracker.until_closed(1)
        await slots_free(url)
        async with client(url) as env:
            # A fresh session: the oversized step never reached the environment.
            assert (await env.step(Ping())).observation.count == 1


async def test_oversized_frame_refused_by_the_websocket_layer() -> None:
    # With `openenv serve`, uvicorn's own limit matches max_message_size.
    with run_server(tracked_app(Tracker()), ws_max_size=1024) as url:
        async with connect(ws_url(url)) as ws:
            await ws.send("x" * 5000)
            assert await _closed_with(ws) == 1009


async def test_client_sending_only_garbage_is_disconnected() -> None:
    with run_server(tracked_app(Tracker(), max_bad_frames=5)) as url:
        async with connect(ws_url(url)) as ws:
            codes = []
            for _ in range(4):
                await ws.send("garbage")
                codes.append(orjson.loads(await ws.recv())["data"]["code"])
            await ws.send('{"type": "state"}')  # one good frame resets the count
            assert orjson.loads(await ws.recv())["type"] == "state"
            for _ in range(5):
                await ws.send("garbage")
                codes.append(orjson.loads(await ws.recv())["data"]["code"])
            assert codes == ["INVALID_JSON"] * 8 + ["SESSION_ERROR"]
            assert await _closed_with(ws) == 1008
        await until(lambda: _active(url, 0), what="slot freed")


async def test_pipelined_messages_are_served_in_order() -> None:
    # Pending frames wait in the server's bounded read queue (TCP back-pressure
    # beyond it); none is dropped and replies keep request order.
    with run_server(tracked_app(Tracker())) as url:
        async with connect(ws_url(url)) as ws:
            for i in range(200):
                await ws.send(orjson.dumps({"type": "step", "data": {}, "id": i}).decode())
            replies = [orjson.loads(await ws.recv()) for _ in range(200)]
    assert [r["id"] for r in replies] == list(range(200))
    assert [r["data"]["observation"]["count"] for r in replies] == list(range(1, 201))


async def _active(url: str, expected: int) -> bool:
    return (await health(url))["active_sessions"] == expected


async def _queued(url: str, expected: int) -> bool:
    return (await health(url))["queued_sessions"] == expected


def _handshake_only(port: int) -> socket.socket:
    """A raw TCP client that completes the WebSocket handshake, then goes silent."""
    sock = socket.create_connection(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


async def test_half_open_client_is_reaped_by_the_heartbeat() -> None:
    tracker = Tracker()
    app = tracked_app(tracker)
    with run_server(app, ws_ping_interval=0.2, ws_ping_timeout=0.2) as url:
        port = int(url.rsplit(":", 1)[1])
        silent = await asyncio.to_thread(_handshake_only, port)
        try:
            await tracker.until_created(1)
            # It never answers a ping, so the server drops it and frees the slot.
            await tracker.until_closed(1)
            await slots_free(url)
            async with client(url) as env:
                assert (await env.reset()).observation.message == "reset:None"
        finally:
            silent.close()


async def test_client_heartbeat_detects_a_silent_server() -> None:
    # A server that completed the handshake and then froze: no pongs come back.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def freeze() -> socket.socket:
        conn, _ = listener.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(4096)
        key = next(  # the handshake answer must echo a hash of the client's key
            line.split(b":", 1)[1].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key")
        )
        accept = base64.b64encode(
            hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
        )
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        return conn

    accepting = asyncio.create_task(asyncio.to_thread(freeze))
    env = client(
        f"http://127.0.0.1:{port}", ping_interval=0.2, ping_timeout=0.2, message_timeout=None
    )
    try:
        await env.connect()
        await accepting
        with pytest.raises(SessionClosedError):
            await env.step(Ping())  # would hang forever without the client's heartbeat
    finally:
        listener.close()
        if accepting.done():
            accepting.result().close()


async def test_admission_queue_lets_the_next_client_in_when_a_slot_frees() -> None:
    tracker = Tracker()
    with run_server(tracked_app(tracker, queue_timeout=10)) as url:
        first = client(url)
        await first.reset()
        second, third = client(url), client(url)
        second_reset = asyncio.create_task(second.reset(seed=2))
        await until(lambda: _queued(url, 1), what="second client queued")
        third_reset = asyncio.create_task(third.reset(seed=3))
        await until(lambda: _queued(url, 2), what="third client queued")
        await first.close()
        assert (await second_reset).observation.message == "reset:2"
        assert not third_reset.done()  # first come, first served
        assert (await health(url))["queued_sessions"] == 1
        await second.close()
        assert (await third_reset).observation.message == "reset:3"
        await third.close()
    assert len(tracker.created) == 3


async def test_admission_queue_refuses_after_queue_timeout() -> None:
    with run_server(tracked_app(Tracker(), queue_timeout=0.2)) as url:
        async with client(url) as holder:
            await holder.reset()
            with pytest.raises(CapacityError) as refused:
                await client(url).reset()
            assert refused.value.max_sessions == 1
            assert (await health(url))["queued_sessions"] == 0


async def test_queued_client_that_leaves_does_not_take_a_slot() -> None:
    with run_server(tracked_app(Tracker(), queue_timeout=10)) as url:
        holder = client(url)
        await holder.reset()
        ws = await connect(ws_url(url))
        await until(lambda: _queued(url, 1), what="client queued")
        ws.transport.abort()
        await holder.close()
        await until(lambda: _active(url, 0), what="all slots free")
        async with client(url) as env:
            assert (await env.reset()).observation.message == "reset:None"
        await until(lambda: _active(url, 0), what="all slots free again")
