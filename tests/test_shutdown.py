"""Graceful shutdown of a real server (a process, on SIGTERM and SIGINT, or in a thread)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest
from servers import Ping, PingEnvironment, Pong, Tracker, health, until
from v2_wire import raw_v2, send
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from openenv import ConcurrencyConfig, create_app
from openenv.client import ws_url
from openenv.protocol_v2 import SUBPROTOCOL
from openenv.server.runner import GracefulServer, uvicorn_config

APPS = Path(__file__).parent / "apps"


def start(port: int, close_log: Path, app: str = "shutdown_app:app") -> subprocess.Popen[bytes]:
    code = (
        "from openenv import serve; "
        f"serve({app!r}, app_dir={str(APPS)!r}, port={port}, log_level='warning')"
    )
    env = {**os.environ, "OPENENV_TEST_CLOSE_LOG": str(close_log)}
    return subprocess.Popen([sys.executable, "-c", code], env=env)


async def wait_healthy(port: int, proc: subprocess.Popen[bytes]) -> None:
    import httpx

    async with httpx.AsyncClient() as http:
        for _ in range(1000):
            assert proc.poll() is None, "server exited during startup"
            try:
                if (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                    return
            except httpx.TransportError:
                await asyncio.sleep(0.02)
    raise AssertionError("server never became healthy")


@contextlib.asynccontextmanager
async def serving(
    port: int, close_log: Path, app: str = "shutdown_app:app"
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """The shutdown app served on ``port``, once healthy; killed at the end if still up."""
    proc = start(port, close_log, app)
    try:
        await wait_healthy(port, proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def open_sessions(port: int, count: int) -> list[ClientConnection]:
    url = ws_url(f"http://127.0.0.1:{port}")
    sessions = [await connect(url) for _ in range(count)]
    for i, ws in enumerate(sessions):
        await ws.send(f'{{"type": "reset", "data": {{"episode_id": "s{i}"}}}}')
    for ws in sessions:
        await ws.recv()
    return sessions


async def open_v2_sessions(port: int, connections: int, per: int) -> list[ClientConnection]:
    """``connections`` v2 connections of ``per`` sessions each, every session reset."""
    url = ws_url(f"http://127.0.0.1:{port}")
    sockets = [
        await connect(url, subprotocols=[SUBPROTOCOL])  # type: ignore[list-item]
        for _ in range(connections)
    ]
    for c, ws in enumerate(sockets):
        opens = [{"session": k, "type": "open"} for k in range(per)]
        resets = [
            {"session": k, "type": "reset", "data": {"episode_id": f"s{c * per + k}"}}
            for k in range(per)
        ]
        await ws.send(orjson.dumps(opens + resets).decode())
    for ws in sockets:
        got = 0
        while got < 2 * per:
            replies = orjson.loads(await ws.recv())
            assert all(r["type"] in ("opened", "observation") for r in replies), replies
            got += len(replies)
    return sockets


async def v2_notices(ws: ClientConnection) -> tuple[list[tuple[int, str]], int | None]:
    """The ``closed`` notices a v2 connection gets (session, reason), and its close code."""
    notices: list[tuple[int, str]] = []
    try:
        while True:
            for reply in orjson.loads(await ws.recv()):
                assert reply["type"] == "closed", reply
                notices.append((reply["session"], reply["data"]["reason"]))
    except ConnectionClosed as closed:
        return notices, closed.rcvd.code if closed.rcvd else None


async def close_code(ws: ClientConnection) -> int | None:
    try:
        while True:
            await ws.recv()  # the SESSION_ERROR "server shutting down" frame comes first
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd else None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_closes_every_session_and_exits_zero(sig: int, tmp_path: Path) -> None:
    port, close_log = free_port(), tmp_path / "closed.txt"
    async with serving(port, close_log) as proc:
        sessions = await open_sessions(port, 100)
        proc.send_signal(sig)
        codes = await asyncio.gather(*(close_code(ws) for ws in sessions))
        assert await asyncio.to_thread(proc.wait, 30) == 0
    assert codes == [1001] * 100
    closed = close_log.read_text().split()
    assert sorted(closed) == sorted(f"s{i}" for i in range(100))

    # The port is free again at once.
    again = start(port, close_log)
    try:
        await wait_healthy(port, again)
    finally:
        again.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(again.wait, 30) == 0


async def test_sigterm_closes_every_session_of_every_v2_connection(tmp_path: Path) -> None:
    port, close_log = free_port(), tmp_path / "closed.txt"
    async with serving(port, close_log) as proc:
        sockets = await open_v2_sessions(port, connections=4, per=25)
        proc.send_signal(signal.SIGTERM)
        heard = await asyncio.gather(*(v2_notices(ws) for ws in sockets))
        assert await asyncio.to_thread(proc.wait, 30) == 0
    # Each session of each connection heard why it ended, then the connection closed 1001.
    assert [sorted(notices) for notices, _ in heard] == [[(k, "shutdown") for k in range(25)]] * 4
    assert [code for _, code in heard] == [1001] * 4
    closed = close_log.read_text().split()
    assert sorted(closed) == sorted(f"s{i}" for i in range(100))


async def test_sigterm_ends_openreward_sessions_and_their_calls_in_flight(tmp_path: Path) -> None:
    """A tool call's open stream must not hold the shutdown past ``shutdown_timeout``
    (it did: the process was killed, exit 1, with no environment closed)."""
    import httpx

    port, close_log = free_port(), tmp_path / "closed.txt"
    async with (
        serving(port, close_log, "openreward_shutdown_app:app") as proc,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
    ):
        sessions = []
        for _ in range(2):
            opened = (await http.post("/create_session")).text
            headers = {"X-Session-ID": opened.split("data: ", 1)[1].split()[0]}
            created = await http.post(
                "/create", json={"split": "train", "index": 0}, headers=headers
            )
            assert created.status_code == 200
            sessions.append(headers)
        call = {"name": "slow", "input": {"seconds": 120}}
        async with http.stream("POST", "/call", json=call, headers=sessions[0]) as stream:
            lines = stream.aiter_lines()
            assert await anext(lines) == "event: task_id"
            proc.send_signal(signal.SIGTERM)  # the call runs; the other session is idle
            rest = [line async for line in lines]
        assert await asyncio.to_thread(proc.wait, 30) == 0
    assert "event: error" in rest
    assert "data: [SESSION_ERROR] the session has ended (shutdown)" in rest
    # The idle session's environment was closed; the one in a call was given up.
    assert close_log.read_text().split() == ["closed"]


@contextlib.contextmanager
def graceful(app: object) -> Iterator[tuple[str, GracefulServer]]:
    """``app`` under ``openenv serve``'s server, in a thread; its URL, and the server
    (``should_exit`` starts the graceful shutdown)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = GracefulServer(uvicorn_config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the server stopped while starting"
            thread.join(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


async def test_a_shutdown_refuses_the_sessions_waiting_for_a_slot() -> None:
    """Sessions in line for a slot (v1 and v2) were given the slots the shutdown
    freed: an environment was made for each while the server stopped, and the v1
    client's connection was then cut with 1012, its reply never sent."""
    tracker = Tracker()
    app = create_app(
        functools.partial(PingEnvironment, tracker, None),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=1, queue_timeout=60),
    )
    with graceful(app) as (url, server):
        holder = await connect(ws_url(url))
        await holder.send('{"type": "reset"}')
        await holder.recv()
        waiting = await connect(ws_url(url))
        waiting_v2 = await raw_v2(url)
        await send(waiting_v2, [{"session": 0, "type": "open", "id": 1}])

        async def both_in_line() -> bool:
            return (await health(url))["queued_sessions"] == 2

        await until(both_in_line, what="two sessions in line")
        server.should_exit = True
        frames = await asyncio.gather(*(received(ws) for ws in (holder, waiting, waiting_v2)))
    held, refused, refused_v2 = frames
    assert [held[-1], refused[-1], refused_v2[-1]] == [1001] * 3
    [reply] = refused[:-1]
    assert reply["data"]["code"] == "SESSION_ERROR"  # type: ignore[index]
    assert reply["data"]["message"].startswith("server shutting down")  # type: ignore[index]
    [[reply_v2]] = refused_v2[:-1]
    assert (reply_v2["id"], reply_v2["data"]["code"]) == (1, "SESSION_ERROR")  # type: ignore[index]
    assert len(tracker.created) == 1  # the holder's alone
    assert len(tracker.closed) == 1


async def received(ws: ClientConnection) -> list[object]:
    """Every frame ``ws`` gets (decoded), then its close code."""
    frames: list[object] = []
    try:
        while True:
            frames.append(orjson.loads(await asyncio.wait_for(ws.recv(), 30)))
    except ConnectionClosed as closed:
        frames.append(closed.rcvd.code if closed.rcvd else None)
    return frames
