"""``BlockingWebSocket``: a client connection driven in the caller's thread, against a real server.

It carries ``RemoteVectorEnv``'s vector sessions, so it must keep what
``websockets.sync.client`` gave them: an idle connection that survives the
server's keepalive, timeouts that leave the connection usable, the server's
own close reported after the messages sent before it, limits on what it
accepts, and no thread or slot left behind.
"""

from __future__ import annotations

import asyncio
import gc
import ssl
import subprocess
import threading
import weakref
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from servers import health, slots_free, until
from websockets.exceptions import ConnectionClosed

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, create_app
from openenv.client import ws_url
from openenv.client.blocking_ws import BlockingWebSocket
from openenv.protocol_v2 import SUBPROTOCOL
from openenv.testing import run_server


def echo_app(sessions: int = 4) -> Any:
    return create_app(
        EchoEnvironment,
        EchoAction,
        EchoObservation,
        ConcurrencyConfig(max_concurrent_envs=sessions),
    )


def exchange(ws: BlockingWebSocket, frame: dict[str, Any]) -> dict[str, Any]:
    ws.send(orjson.dumps(frame).decode())
    reply: dict[str, Any] = orjson.loads(ws.recv(timeout=10))
    return reply


def drain(ws: BlockingWebSocket) -> None:
    """Receive until the connection reports its close (which raises)."""
    while True:
        ws.recv(timeout=10)


def keepers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "openenv-ws-keepalive"]


async def test_replies_come_in_order_and_close_frees_the_slot_and_the_thread() -> None:
    with run_server(echo_app()) as url:
        ws = BlockingWebSocket(ws_url(url))
        assert len(keepers()) == 1
        assert exchange(ws, {"type": "reset", "id": 0})["id"] == 0
        for i in range(1, 50):
            reply = exchange(ws, {"type": "step", "id": i, "data": {"message": "x" * i}})
            assert reply["id"] == i
            assert reply["data"]["observation"]["message_length"] == i
        assert (await health(url))["active_sessions"] == 1
        ws.close()
        ws.close()  # idempotent
        await slots_free(url)
        assert keepers() == []
        with pytest.raises(ConnectionClosed):
            ws.send("{}")


async def test_a_connection_dropped_unclosed_frees_its_slot_and_its_thread() -> None:
    with run_server(echo_app(sessions=1)) as url:
        ws = BlockingWebSocket(ws_url(url), keepalive=0.01)  # its keeper busy, not asleep
        exchange(ws, {"type": "reset"})
        dropped = weakref.ref(ws)
        del ws
        gc.collect()
        assert dropped() is None  # its own keepalive thread does not keep it alive
        await slots_free(url)
        await until(_none_left, what="the keepalive thread ended")
        again = BlockingWebSocket(ws_url(url))  # the one slot is there to take
        try:
            assert exchange(again, {"type": "reset"})["type"] == "observation"
        finally:
            again.close()


async def test_a_remote_vector_env_dropped_unclosed_frees_its_sessions() -> None:
    from openenv.adapters.gymnasium import RemoteVectorEnv, create_gymnasium_app

    app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=2))
    with run_server(app) as url:
        for _ in range(3):  # one a run, never closed: each needs both slots
            envs = RemoteVectorEnv(url, num_envs=2)
            envs.reset(seed=0)
            del envs
            gc.collect()
            await slots_free(url)
        await until(_none_left, what="the keepalive threads ended")


async def _none_left() -> bool:
    return keepers() == []


async def test_it_offers_subprotocols_and_reports_the_one_chosen() -> None:
    with run_server(echo_app()) as url:
        ws = BlockingWebSocket(ws_url(url), subprotocols=[SUBPROTOCOL])
        try:
            assert ws.subprotocol == SUBPROTOCOL
            ws.send(orjson.dumps([{"session": "a", "type": "open", "id": 1}]).decode())
            (opened,) = orjson.loads(ws.recv(timeout=10))
            assert opened["type"] == "opened"
            assert opened["session"] == "a"
        finally:
            ws.close()


@pytest.mark.parametrize("keepalive", [0.02, 3600.0], ids=["answered", "unanswered"])
async def test_an_idle_connection_answers_the_servers_pings(keepalive: float) -> None:
    # The server pings every 100 ms and gives up 500 ms later (slack for a loaded
    # machine's scheduling). Idle for 1.5 s (nobody calls recv), the connection
    # lives only if the keepalive thread answers; with it (in effect) off, the
    # server closes it, as it should.
    with run_server(echo_app(), ws_ping_interval=0.1, ws_ping_timeout=0.5) as url:
        ws = BlockingWebSocket(ws_url(url), keepalive=keepalive)
        try:
            exchange(ws, {"type": "reset"})
            await asyncio.sleep(1.5)  # the scenario: a trainer busy elsewhere (not a sync)
            if keepalive < 1:
                assert exchange(ws, {"type": "step", "data": {"message": "hi"}})["type"] == (
                    "observation"
                )
            else:
                with pytest.raises(ConnectionClosed):
                    exchange(ws, {"type": "step", "data": {"message": "hi"}})
        finally:
            ws.close()
        await slots_free(url)


async def test_a_timeout_leaves_the_connection_usable() -> None:
    with run_server(echo_app()) as url:
        ws = BlockingWebSocket(ws_url(url))
        try:
            exchange(ws, {"type": "reset"})
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.05)  # nothing was asked
            reply = exchange(ws, {"type": "step", "id": 7, "data": {"message": "after"}})
            assert reply["id"] == 7
        finally:
            ws.close()


async def test_the_servers_close_comes_after_the_messages_it_sent_first() -> None:
    # A full server answers a new connection with an error, then closes it 1013.
    with run_server(echo_app(sessions=1)) as url:
        holder = BlockingWebSocket(ws_url(url))
        try:
            exchange(holder, {"type": "reset"})
            refused = BlockingWebSocket(ws_url(url))
            try:
                error = orjson.loads(refused.recv(timeout=10))
                assert error["type"] == "error"
                assert error["data"]["code"] == "CAPACITY_REACHED"
                with pytest.raises(ConnectionClosed) as closed:
                    refused.recv(timeout=10)
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 1013
            finally:
                refused.close()
            assert exchange(holder, {"type": "step", "data": {"message": "ok"}})["type"] == (
                "observation"
            )
        finally:
            holder.close()


async def test_a_message_over_max_size_fails_the_connection() -> None:
    with run_server(echo_app()) as url:
        ws = BlockingWebSocket(ws_url(url), max_size=200)
        try:
            exchange(ws, {"type": "reset"})
            ws.send(orjson.dumps({"type": "step", "data": {"message": "y" * 1000}}).decode())
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.sent is not None
            assert closed.value.sent.code == 1009  # message too big
        finally:
            ws.close()
        await slots_free(url)


async def test_a_server_that_goes_away_mid_wait_ends_the_wait() -> None:
    server = run_server(echo_app())
    url = server.__enter__()
    ws = BlockingWebSocket(ws_url(url))
    try:
        exchange(ws, {"type": "reset"})
        server.__exit__(None, None, None)  # a shutdown: the session is closed 1001
        with pytest.raises(ConnectionClosed):
            drain(ws)
    finally:
        ws.close()
    assert keepers() == []


async def test_nothing_listening_is_an_os_error() -> None:
    with run_server(echo_app()) as url:
        pass  # its port is free again
    with pytest.raises(ConnectionRefusedError):
        BlockingWebSocket(ws_url(url), open_timeout=2)


@pytest.mark.parametrize("busy_poll", [0.0, 0.5], ids=["sleeping", "busy-polling"])
async def test_a_timeout_holds_whether_it_polls_or_sleeps(busy_poll: float) -> None:
    with run_server(echo_app()) as url:
        ws = BlockingWebSocket(ws_url(url), busy_poll=busy_poll)
        try:
            exchange(ws, {"type": "reset"})
            for i in range(20):  # replies that come while it polls
                assert exchange(ws, {"type": "step", "id": i, "data": {"message": "p"}})["id"] == i
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.05)  # shorter than busy_poll: the timeout wins
            assert exchange(ws, {"type": "step", "id": 99, "data": {"message": "q"}})["id"] == 99
        finally:
            ws.close()


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed key and certificate for 127.0.0.1 (Debian's openssl)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


async def test_a_message_larger_than_the_socket_buffer_goes_after_a_busy_polled_recv() -> None:
    # Busy polling leaves the socket non-blocking; a send must still write it all.
    app = create_app(
        EchoEnvironment,
        EchoAction,
        EchoObservation,
        ConcurrencyConfig(max_concurrent_envs=1),
        max_message_size=2**26,
    )
    with run_server(app, ws_max_size=2**26) as url:
        ws = BlockingWebSocket(ws_url(url), busy_poll=0.5)
        try:
            assert exchange(ws, {"type": "reset"})["type"] == "observation"
            message = "x" * 32_000_000
            reply = exchange(ws, {"type": "step", "data": {"message": message}})
            assert reply["data"]["observation"]["message_length"] == len(message)
        finally:
            ws.close()
        await slots_free(url)


async def test_it_speaks_tls(certificate: tuple[Path, Path]) -> None:
    key, cert = certificate
    trusted = ssl.create_default_context(cafile=str(cert))
    with run_server(echo_app(), ssl_keyfile=str(key), ssl_certfile=str(cert)) as url:
        secure = ws_url(url).replace("ws://", "wss://")
        with pytest.raises(ssl.SSLError):  # a certificate nobody vouches for
            BlockingWebSocket(secure)
        ws = BlockingWebSocket(secure, ssl_context=trusted, busy_poll=0.01)
        try:
            exchange(ws, {"type": "reset"})
            reply = exchange(ws, {"type": "step", "data": {"message": "over tls"}})
            assert reply["data"]["observation"]["message_length"] == len("over tls")
            with pytest.raises(TimeoutError):
                ws.recv(timeout=0.05)
        finally:
            ws.close()
        https = url.replace("http:", "https:")
        async with httpx.AsyncClient(base_url=https, verify=trusted) as http:

            async def free() -> bool:
                return bool((await http.get("/health")).json()["active_sessions"] == 0)

            await until(free, what="the TLS session's slot free")
