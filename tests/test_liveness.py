"""Liveness under hostile clients and blocking environments (issue 16, findings 2, 3, 7).

A client that stops reading, blocking ``def`` steps, an ``async def`` step that
blocks the loop, and a shutdown with steps that never return: no slot is held
for good, other sessions go on, and SIGTERM ends the process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_envs import write_env
from dockerfiles import wait_healthy
from servers import Ping, PingEnvironment, Pong, Tracker, health, slots_free, until
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from openenv import ConcurrencyConfig, WebSocketEnvClient, create_app
from openenv.client import ws_url
from openenv.testing import run_server

OPENENV = Path(sys.executable).with_name("openenv")
PAYLOAD = "y" * 60_000  # each step's frame, echoed back in its reply


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _frame(text: str) -> bytes:
    """A masked, final text frame, as a client sends it."""
    payload = text.encode()
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        head = bytes((0x81, 0x80 | size))
    elif size < 65536:
        head = bytes((0x81, 0x80 | 126)) + size.to_bytes(2)
    else:
        head = bytes((0x81, 0x80 | 127)) + size.to_bytes(8)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


def stalled_client(port: int, v2_sessions: int = 0) -> socket.socket:
    """A raw client that completes the handshake, then sends steps and never reads.

    Returns once the server stops reading its frames (its sends block): by then
    every buffer between them is full and the server is stuck sending a reply
    (or, with a send deadline, has already dropped the connection). With
    ``v2_sessions`` it speaks protocol v2, and steps that many sessions at once.
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n"
            + ("Sec-WebSocket-Protocol: openenv.v2\r\n" if v2_sessions else "")
            + "\r\n"
        ).encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert response.startswith(b"HTTP/1.1 101"), response
    if v2_sessions:
        keys = range(v2_sessions)
        sock.sendall(_frame(orjson.dumps([{"session": k, "type": "open"} for k in keys]).decode()))
        step = _frame(
            orjson.dumps(
                [{"session": k, "type": "step", "data": {"message": PAYLOAD}} for k in keys]
            ).decode()
        )
    else:
        sock.sendall(_frame('{"type": "reset"}'))
        step = _frame(orjson.dumps({"type": "step", "data": {"message": PAYLOAD}}).decode())
    sock.settimeout(2.0)
    with contextlib.suppress(TimeoutError, OSError):  # blocked, or dropped by the server
        while True:
            sock.sendall(step)
    return sock


class Echo(PingEnvironment):
    """Replies to every step with its (large) message."""

    def __init__(self) -> None:
        super().__init__(TRACKER)


TRACKER = Tracker()


@pytest.fixture(autouse=True)
def _fresh_tracker() -> None:
    global TRACKER
    TRACKER = Tracker()


async def test_client_that_stops_reading_is_aborted_and_its_slot_freed() -> None:
    app = create_app(Echo, Ping, Pong, send_timeout=0.5)
    with run_server(app) as url:
        stalled = await asyncio.to_thread(stalled_client, _port(url))
        try:
            await TRACKER.until_closed(1)  # its session ended, its environment closed
            await slots_free(url)
            # The cap is one session: the next client gets it.
            async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
                assert (await env.step(Ping(message="hi"))).observation.message == "hi"
            # The server dropped the socket, unread replies and all.
            stalled.settimeout(10)
            with contextlib.suppress(ConnectionResetError):  # reset, or EOF after the rest
                while stalled.recv(1 << 20):
                    pass
        finally:
            stalled.close()


@pytest.mark.parametrize("ws", ["openenv", "websockets-sansio"])
async def test_a_v2_client_that_stops_reading_loses_every_session_and_slot(ws: str) -> None:
    app = create_app(Echo, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4), send_timeout=0.5)
    with run_server(app, **({} if ws == "openenv" else {"ws": ws})) as url:
        stalled = await asyncio.to_thread(stalled_client, _port(url), 4)
        try:
            await TRACKER.until_closed(4)  # all four sessions ended, environments closed
            await slots_free(url)
            async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
                assert (await env.step(Ping(message="hi"))).observation.message == "hi"
        finally:
            stalled.close()


async def test_under_uvicorns_own_protocol_the_slot_is_freed_too() -> None:
    app = create_app(Echo, Ping, Pong, send_timeout=0.5)
    with run_server(app, ws="websockets-sansio") as url:
        stalled = await asyncio.to_thread(stalled_client, _port(url))
        try:
            await TRACKER.until_closed(1)
            async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
                assert (await env.step(Ping(message="hi"))).observation.message == "hi"
        finally:
            stalled.close()


async def test_idle_reaping_goes_on_while_a_client_does_not_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="openenv.server")
    # The default send deadline (30 s) outlasts this test: the stalled client's
    # expiry stays stuck in its send all along.
    config = ConcurrencyConfig(max_concurrent_envs=4, session_timeout=0.5)
    with run_server(create_app(Echo, Ping, Pong, config)) as url:
        stalled = await asyncio.to_thread(stalled_client, _port(url))
        try:

            async def reaper_took_it() -> bool:
                return any("idle over" in r.getMessage() for r in caplog.records)

            await until(reaper_took_it, what="the stalled session picked as idle")
            # A session that goes idle after that is reaped all the same.
            ws = await connect(ws_url(url))
            await ws.send('{"type": "reset"}')
            await ws.recv()
            frames = await asyncio.wait_for(_closing_frames(ws), 10)
            assert frames[0]["data"]["message"] == "session closed after being idle too long"
            assert ws.close_code == 1001
            await TRACKER.until_closed(1)
        finally:
            stalled.close()


STALL_APP = """
from typing import Any

from openenv import Action, ConcurrencyConfig, Environment, Observation, State, create_app


class Say(Action):
    message: str = ""


class Said(Observation):
    message: str = ""


class Echo(Environment[Say, Said, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Said:
        return Said()

    def step(self, action: Say, **kwargs: Any) -> Said:
        return Said(message=action.message)

    @property
    def state(self) -> State:
        return State()


app = create_app(Echo, Say, Said, ConcurrencyConfig(max_concurrent_envs=4), shutdown_timeout=1)
"""


@contextlib.contextmanager
def serving(folder: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``openenv serve FOLDER`` in a process of its own; killed if still alive at the end."""
    log, out = folder / "serve.log", folder / "serve.out"
    with log.open("wb") as err, out.open("wb") as stdout:
        proc = subprocess.Popen(
            [OPENENV, "serve", str(folder), "--port", "0"],
            stdout=stdout,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not (match := re.search(r"at (http://\S+) \(", out.read_text())):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        wait_healthy(match.group(1), proc, log)
        yield match.group(1), proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _exit_code(proc: subprocess.Popen[bytes], wait: float = 30) -> int | None:
    try:
        return proc.wait(wait)
    except subprocess.TimeoutExpired:
        return None


async def test_sigterm_ends_openenv_serve_despite_a_client_that_does_not_read(
    tmp_path: Path,
) -> None:
    folder = write_env(tmp_path / "env", app=STALL_APP)
    with serving(folder) as (url, proc):
        stalled = await asyncio.to_thread(stalled_client, _port(url))
        try:
            async with WebSocketEnvClient(url, observation_cls=Pong) as bystander:
                await bystander.reset()
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(_exit_code, proc) == 0
        finally:
            stalled.close()


HUNG_APP = """
import os
import threading
from typing import Any

from openenv import Action, ConcurrencyConfig, Environment, Observation, State, create_app

LOG = os.path.join(os.path.dirname(__file__), "steps.log")


class Hang(Action):
    name: str = ""
    block: bool = False


class Nothing(Observation):
    pass


class Hung(Environment[Hang, Nothing, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Nothing:
        return Nothing()

    def step(self, action: Hang, **kwargs: Any) -> Nothing:
        with open(LOG, "a") as log:
            log.write(action.name + "\\n")
        if action.block:
            threading.Event().wait()  # never returns
        return Nothing()

    @property
    def state(self) -> State:
        return State()


app = create_app(
    Hung, Hang, Nothing, ConcurrencyConfig(max_concurrent_envs=8), max_threads=1, shutdown_timeout=1
)
"""


async def _session(url: str) -> ClientConnection:
    ws = await connect(ws_url(url))
    await ws.send('{"type": "reset"}')
    await ws.recv()
    return ws


async def _closing_frames(ws: ClientConnection) -> list[dict[str, Any]]:
    frames = []
    with contextlib.suppress(ConnectionClosed):
        while True:
            frames.append(orjson.loads(await ws.recv()))
    return frames


async def test_shutdown_with_hung_steps_refuses_queued_ones_and_exits(tmp_path: Path) -> None:
    folder = write_env(tmp_path / "env", app=HUNG_APP)
    steps_log = folder / "server" / "steps.log"

    async def started() -> list[str]:
        return steps_log.read_text().split() if steps_log.exists() else []

    with serving(folder) as (url, proc):
        hung = [await _session(url) for _ in range(2)]
        queued = await _session(url)
        for i, ws in enumerate(hung):
            await ws.send(orjson.dumps({"type": "step", "data": {"name": f"h{i}", "block": True}}))

        async def both_started() -> bool:
            return len(await started()) == 2

        # With max_threads=1, the first blocked thread leaves the fast lane for
        # the second; a third call finds both lanes full and waits.
        await until(both_started, what="both hung steps started")
        await queued.send('{"type": "step", "data": {"name": "queued"}}')

        async def degraded() -> bool:
            return (await health(url))["status"] == "degraded"

        await until(degraded, what="/health reporting the waiting call")
        proc.send_signal(signal.SIGTERM)
        frames = await asyncio.wait_for(_closing_frames(queued), 30)
        assert await asyncio.to_thread(_exit_code, proc) == 0
    # The queued step was refused, never run; the hung ones were abandoned.
    assert sorted(await started()) == ["h0", "h1"]
    assert frames, "no reply to the queued step nor a closing frame"
    assert {(f["type"], f["data"]["code"], f["data"]["message"]) for f in frames} == {
        ("error", "SESSION_ERROR", "server shutting down")
    }


class Gated(PingEnvironment):
    """Blocks a step until the test's gate opens; counts the steps that began."""

    gate = threading.Event()
    began: list[str] = []

    def step(self, action: Ping, **kwargs: Any) -> Pong:
        type(self).began.append(action.message)
        if action.block:
            type(self).gate.wait(60)
        return super().step(Ping(message=action.message))


async def _reply(ws: ClientConnection) -> dict[str, Any]:
    return dict(orjson.loads(await asyncio.wait_for(ws.recv(), 30)))


async def test_blocking_steps_do_not_starve_new_sessions() -> None:
    Gated.gate, Gated.began = threading.Event(), []
    app = create_app(Gated, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=8), max_threads=2)
    with run_server(app) as url:
        try:
            blocked = [await _session(url) for _ in range(2)]
            for i, ws in enumerate(blocked):
                await ws.send(
                    orjson.dumps({"type": "step", "data": {"message": f"b{i}", "block": True}})
                )

            async def both_began() -> bool:
                return len(Gated.began) == 2

            await until(both_began, what="both blocking steps running")
            # Every fast thread is blocked: a new session is made and served anyway.
            async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
                await asyncio.wait_for(env.reset(), 10)
                reply = await asyncio.wait_for(env.step(Ping(message="quick")), 10)
                assert reply.observation.message == "quick"
            assert (await health(url))["status"] == "healthy"
        finally:
            Gated.gate.set()
        for ws in blocked:
            assert (await _reply(ws))["type"] == "observation"
            await ws.close()


async def test_a_step_waiting_for_a_thread_is_not_timed_out() -> None:
    Gated.gate, Gated.began = threading.Event(), []
    app = create_app(
        Gated, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=8), max_threads=1, step_timeout=1
    )
    with run_server(app) as url:
        try:
            hung = [await _session(url) for _ in range(2)]
            waiting = await _session(url)
            for i, ws in enumerate(hung):
                await ws.send(
                    orjson.dumps({"type": "step", "data": {"message": f"h{i}", "block": True}})
                )

            async def both_began() -> bool:
                return len(Gated.began) == 2

            await until(both_began, what="both blocking steps running")
            await waiting.send('{"type": "step", "data": {"message": "waits"}}')
            for ws in hung:  # they ran for a second: timed out
                assert (await _reply(ws))["data"]["code"] == "TIMEOUT"
        finally:
            Gated.gate.set()
        # The waiting step had no thread until the hung ones returned; then it ran.
        reply = await _reply(waiting)
        assert reply["type"] == "observation", reply
        assert reply["data"]["observation"]["message"] == "waits"
        await waiting.close()
        await slots_free(url)


class Held(PingEnvironment):
    """Steps whose message names a gate block until the test opens it; a "nap"
    step is merely slow (longer than the hand-over's slow_after), which sends
    its session's later calls to the slow lane."""

    gates: dict[str, threading.Event] = {}
    began: list[str] = []

    def step(self, action: Ping, **kwargs: Any) -> Pong:
        type(self).began.append(action.message)
        if action.message == "nap":
            time.sleep(0.1)  # the call under test is slow, not a synchronisation
        elif (gate := type(self).gates.get(action.message)) is not None:
            gate.wait(60)
        return super().step(Ping(message=action.message))


@pytest.mark.parametrize("queued", ["step", "close"])
@pytest.mark.parametrize("step_timeout", [None, 60])
async def test_a_slow_session_is_served_once_a_thread_that_left_the_fast_lane_returns(
    step_timeout: float | None, queued: str
) -> None:
    """With max_threads=1, a blocked thread that left the fast lane holds the slow
    lane's one place; a slow session's step (or close(), which frees its slot)
    queued meanwhile waited forever after that thread's call returned. So did
    the close() of a session whose blocking step had timed out, when it was
    queued in the moment before that step's thread ended: its slot stayed taken."""
    Held.gates, Held.began = {"a": threading.Event(), "b": threading.Event()}, []
    app = create_app(
        Held,
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=8),
        max_threads=1,
        step_timeout=step_timeout,
    )

    async def began(message: str) -> None:
        async def check() -> bool:
            return message in Held.began

        await until(check, what=f"step {message!r} running")

    with run_server(app) as url:
        try:
            first, second, slow = [await _session(url) for _ in range(3)]
            await slow.send('{"type": "step", "data": {"message": "nap"}}')
            assert (await _reply(slow))["data"]["observation"]["message"] == "nap"
            await first.send('{"type": "step", "data": {"message": "a"}}')
            await began("a")
            # The one fast thread is blocked: the second step begins only once
            # that thread has left the fast lane for another to take its place.
            await second.send('{"type": "step", "data": {"message": "b"}}')
            await began("b")
            if queued == "step":
                await slow.send('{"type": "step", "data": {"message": "c"}}')
            else:
                await slow.close()

            async def no_thread_for_it() -> bool:
                return "wait for a worker thread" in (await health(url)).get("reason", "")

            await until(no_thread_for_it, what=f"the slow session's {queued} waiting for a thread")
            Held.gates["a"].set()
            assert (await _reply(first))["data"]["observation"]["message"] == "a"
            # That thread is free of its call: the slow session's call gets it.
            if queued == "step":
                reply = await _reply(slow)
                assert reply["type"] == "observation", reply
                assert reply["data"]["observation"]["message"] == "c"
            else:

                async def slot_freed() -> bool:
                    return (await health(url))["active_sessions"] == 2

                await until(slot_freed, what="the closed session's slot freed")
        finally:
            for gate in Held.gates.values():
                gate.set()
        assert (await _reply(second))["data"]["observation"]["message"] == "b"
        for ws in (first, second, slow):
            await ws.close()
        await slots_free(url)


class LoopBlocker(PingEnvironment):
    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        time.sleep(1.5)  # noqa: ASYNC251 - the bug under test: blocking inside async def
        return PingEnvironment.step(self, action)


async def test_an_async_step_that_blocks_the_loop_is_logged_with_its_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="openenv.server")
    with run_server(create_app(LoopBlocker, Ping, Pong)) as url:
        async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
            await env.reset()
            await env.step(Ping(message="slow"))
            blocked = [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
            assert blocked, "no warning about the blocked loop"
            assert re.search(r"by session [0-9a-f]{12}\b", blocked[0]), blocked[0]
            reply = await health(url)
            assert reply["status"] == "degraded"
            assert "event loop" in reply["reason"]


async def test_queued_clients_that_leave_leave_the_line_at_once() -> None:
    """A v1 client that vanished while in line stayed counted in ``queued_sessions``
    (which pools and fleets subtract from the room they see) until a slot freed
    or its ``queue_timeout`` passed."""
    app = create_app(Echo, Ping, Pong, ConcurrencyConfig(queue_timeout=60))
    with run_server(app) as url:
        async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as holder:
            await holder.reset()
            # As openenv's clients connect: uncompressed (compressed frames:
            # test_queued_compressed_clients.py).
            queued = [await connect(ws_url(url), compression=None) for _ in range(3)]
            await queued[0].send('{"type": "reset"}')  # a frame sent while in line, too

            async def in_line(count: int) -> Any:
                async def reached() -> bool:
                    return (await health(url))["queued_sessions"] == count

                return reached

            await until(await in_line(3), what="three clients in line")
            queued[0].transport.abort()
            await queued[1].close()
            await until(await in_line(1), what="the two that left out of line")
            # The one still in line gets the slot the holder frees, and plays.
            await holder.close()
            await queued[2].send('{"type": "step", "data": {"message": "next"}}')
            reply = orjson.loads(await queued[2].recv())
            assert reply["data"]["observation"]["message"] == "next"
            await queued[2].close()
        await slots_free(url)
        assert (await health(url))["queued_sessions"] == 0
    assert len(TRACKER.created) == 2  # the holder's and the last one's


async def test_queued_clients_that_left_get_no_environment() -> None:
    app = create_app(Echo, Ping, Pong, ConcurrencyConfig(queue_timeout=30))
    with run_server(app) as url:
        holder = WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong)
        await holder.reset()
        queued = [await connect(ws_url(url)) for _ in range(3)]

        async def all_queued() -> bool:
            return (await health(url))["queued_sessions"] == 3

        await until(all_queued, what="three clients in line")
        for ws in queued:
            ws.transport.abort()
        await health(url)  # a round trip after the resets reached the server
        await holder.close()
        async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
            assert (await env.step(Ping(message="next"))).observation.message == "next"
        # The holder's environment and this one: none for the clients that left.
        assert len(TRACKER.created) == 2
        await slots_free(url)
