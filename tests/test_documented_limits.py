"""Promises of docs/production.md and docs/security.md not attacked elsewhere:
a session inside a running step is never idle, on /ws with either kind of
step; the header limits' environment variables; ``OPENENV_RECORD``."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_envs import write_env
from servers import Ping, PingEnvironment, Pong, Tracker, health, ping_app, until
from test_cli_serve import serving
from test_sessions_live import ping_client
from websockets.asyncio.client import ClientConnection, connect

from openenv import (
    ConcurrencyConfig,
    ConnectionFailedError,
    MuxClient,
    ServerPool,
    ServerSettings,
    WebSocketEnvClient,
)
from openenv.client import ws_url
from openenv.testing import run_server
from openenv.trajectories import load


class AsyncBlocking(PingEnvironment):
    """An ``async def`` step that waits for the gate without holding the event loop."""

    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        if action.block:
            assert self.gate is not None
            await asyncio.to_thread(self.gate.wait, 30)
        return PingEnvironment.step(self, Ping(message=action.message))


async def _send(ws: ClientConnection, kind: str, data: dict[str, Any] | None = None) -> None:
    await ws.send(orjson.dumps({"type": kind, "data": data or {}}))


async def _reply(ws: ClientConnection) -> dict[str, Any]:
    reply: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
    return reply


@pytest.mark.parametrize("env_cls", [PingEnvironment, AsyncBlocking], ids=["def", "async"])
async def test_a_v1_session_inside_a_long_step_is_not_reaped_as_idle(env_cls: type) -> None:
    """production.md: "A session whose step is running is never idle"."""
    tracker, gate = Tracker(), threading.Event()
    app = ping_app(tracker, env_cls=env_cls, gate=gate, session_timeout=0.2, reap_interval=0.02)
    with run_server(app) as url:
        async with connect(ws_url(url)) as stepping, connect(ws_url(url)) as idle:
            await _send(stepping, "reset")
            await _reply(stepping)
            await _send(stepping, "step", {"message": "long", "block": True})
            # The idle session's last frame comes after the long step began: once
            # it is reaped, the stepping session has been silent for longer.
            await _send(idle, "reset")
            await _reply(idle)
            assert (await _reply(idle))["data"]["code"] == "SESSION_ERROR"

            async def one_session_left() -> bool:
                return (await health(url))["active_sessions"] == 1

            await until(one_session_left, what="the idle session reaped")
            gate.set()
            reply = await _reply(stepping)
            assert reply["type"] == "observation", reply
            assert reply["data"]["observation"]["count"] == 1
            await _send(stepping, "step", {"message": "again"})
            assert (await _reply(stepping))["data"]["observation"]["count"] == 2


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a socket timeout fails the test."""
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    return reply


def test_openenv_serve_takes_the_header_limits_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """security.md: ``OPENENV_HEADER_TIMEOUT`` (10 s) and ``OPENENV_MAX_HEADER_BYTES``
    (1 MiB). The socket waits 5 s, half the default deadline, so a server that
    ignored the variables would fail it."""
    monkeypatch.setenv("OPENENV_HEADER_TIMEOUT", "0.3")
    monkeypatch.setenv("OPENENV_MAX_HEADER_BYTES", "4096")
    with serving(write_env(tmp_path / "env")) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as silent:
            assert _read_to_close(silent) == b""
        with socket.create_connection((host, int(port)), timeout=5) as big:
            big.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 8192)
            reply = _read_to_close(big)
        assert reply.startswith(b"HTTP/1.1 431 "), reply[:200]
        assert reply.endswith(b"request headers over 4096 bytes")
        with socket.create_connection((host, int(port)), timeout=5) as small:
            small.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Small: ab\r\n\r\n")
            assert small.recv(65536).startswith(b"HTTP/1.1 200")


async def test_openenv_record_records_every_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: ``create_app(..., record=...)`` (or ``OPENENV_RECORD``)."""
    monkeypatch.setenv("OPENENV_RECORD", str(tmp_path / "rec"))
    with run_server(ping_app(Tracker())) as url:
        async with ping_client(url) as client:
            await client.reset(seed=7)
            await client.step(Ping(message="a"))
    (episode,) = load(tmp_path / "rec")
    assert [s.kind for s in episode.steps] == ["reset", "step"]
    assert episode.steps[1].request["message"] == "a"
    assert episode.total_reward == 1.0


async def test_a_mux_client_names_the_url_when_nothing_listens_or_answers() -> None:
    """clients.md: ``ConnectionFailedError`` naming the URL within ``connect_timeout``,
    for ``MuxClient`` as for ``EnvClient`` (test_client.py)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(
        ConnectionFailedError, match=rf"cannot connect to ws://127\.0\.0\.1:{port}/ws"
    ):
        await MuxClient(f"http://127.0.0.1:{port}").open(1)
    with socket.socket() as silent:  # listens, never accepts: no handshake
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ConnectionFailedError, match=r"/ws: no answer within 0\.2s"):
            await MuxClient(url, connect_timeout=0.2).open(2)


def test_a_mux_client_given_a_pool_says_it_holds_one_server() -> None:
    """scaling.md: a comma-joined URL string is a pool where clients take a URL;
    ``MuxClient`` is one connection to one server, and says so up front rather
    than failing at connect on a "port" of ``8000,http:``."""
    with pytest.raises(ValueError, match="MuxClient holds one connection to one server"):
        MuxClient("http://127.0.0.1:8000,http://127.0.0.1:8001")


def test_the_documented_defaults_are_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults the tables of production.md, security.md, clients.md and
    scaling.md (and README's production settings) state, as the code has them."""
    for name in ("OPENENV_SESSION_TIMEOUT", "OPENENV_QUEUE_TIMEOUT", "OPENENV_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    settings = ServerSettings()
    assert (settings.send_timeout, settings.shutdown_timeout) == (30.0, 10.0)
    assert (settings.step_timeout, settings.reset_timeout) == (None, None)
    assert (settings.max_threads, settings.max_message_size, settings.max_bad_frames) == (
        64,
        1 << 20,
        20,
    )
    assert (settings.factory_timeout, settings.close_timeout) == (60.0, 10.0)
    assert (settings.api_key, settings.error_details, settings.mcp_open_timeout) == (
        None,
        False,
        30.0,
    )
    assert ConcurrencyConfig().session_timeout == 300.0
    for client in (WebSocketEnvClient("http://127.0.0.1:1"), MuxClient("http://127.0.0.1:1")):
        assert (client.connect_timeout, client.message_timeout) == (10.0, 60.0)
    pool = ServerPool(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    assert (pool.wait, pool.health_timeout) == (60.0, 5.0)
