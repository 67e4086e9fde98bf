"""Client behaviour that does not depend on a particular environment."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading

import pytest
from servers import Held, Hold, Holding, Ping, PingEnvironment, Pong, slots_free
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from tcp_proxy import TcpProxy

from echo_env import EchoAction, EchoEnv
from openenv import (
    AuthenticationError,
    ConnectionFailedError,
    EnvTimeoutError,
    SessionClosedError,
    WebSocketEnvClient,
    create_app,
)
from openenv.client import http_url, ws_url
from openenv.testing import run_server


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://h:1", "ws://h:1/ws"),
        ("http://h:1/", "ws://h:1/ws"),
        ("https://h", "wss://h/ws"),
        ("ws://h:1/ws", "ws://h:1/ws"),
        ("wss://h/envs/echo/ws", "wss://h/envs/echo/ws"),
        ("http://h:1/prefix", "ws://h:1/prefix/ws"),
    ],
)
def test_url_forms(base: str, expected: str) -> None:
    assert ws_url(base) == expected


def test_http_url_from_a_session_url() -> None:
    assert http_url("wss://h/envs/echo/ws") == "https://h/envs/echo"


@pytest.mark.parametrize(
    "bad", ["localhost:8000", "ftp://h", "http://", "http://h:notaport", "http://h:99999"]
)
def test_bad_urls_are_refused_up_front(bad: str) -> None:
    with pytest.raises(ValueError, match="isn't a valid environment URL"):
        EchoEnv(bad)


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_nothing_listening_is_a_clear_connection_error() -> None:
    url = f"http://127.0.0.1:{_unused_port()}"
    with pytest.raises(ConnectionFailedError, match=r"cannot connect to ws://127\.0\.0\.1"):
        await EchoEnv(url, connect_timeout=5).reset()


@pytest.mark.parametrize("path", ["/wss", "/nothing/here"])
async def test_a_wrong_path_is_named_as_such_not_as_an_auth_problem(
    echo_url: str, path: str
) -> None:
    client = WebSocketEnvClient(f"{echo_url.replace('http', 'ws')}{path}")
    with pytest.raises(ConnectionFailedError, match="is this the server's root URL") as caught:
        await client.reset()
    assert not isinstance(caught.value, AuthenticationError)
    assert path in str(caught.value)


async def test_connect_timeout_when_the_server_never_answers() -> None:
    # A listening socket that never accepts: the handshake cannot complete.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ConnectionFailedError, match=r"no answer within 0.2s"):
            await EchoEnv(url, connect_timeout=0.2).connect()


async def test_message_timeout_raises_instead_of_hanging() -> None:
    gate = threading.Event()
    app = create_app(lambda: PingEnvironment(gate=gate), Ping, Pong)
    with run_server(app) as url:
        client = WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong, message_timeout=0.2)
        await client.reset()
        with pytest.raises(EnvTimeoutError, match=r"no reply to 'step' within 0\.2s"):
            await client.step(Ping(block=True))
        gate.set()
        await client.close()


async def test_a_server_that_stops_reading_times_out_the_call_and_close_is_bounded() -> None:
    # An action larger than every buffer on the way (loopback's grow to 32 MiB):
    # its send waits on the server.
    big = Ping(message="x" * 64_000_000)
    # No pings either way: only the client's own limits can end its waits.
    with run_server(create_app(PingEnvironment, Ping, Pong), ws_ping_interval=None) as url:
        with TcpProxy(url) as proxy:
            client = WebSocketEnvClient(
                proxy.url,
                action_cls=Ping,
                observation_cls=Pong,
                message_timeout=0.5,
                connect_timeout=1,
                ping_interval=None,
            )
            await client.reset()
            proxy.stop_reading()
            async with asyncio.timeout(60):  # a guard: without the limits both wait for ever
                with pytest.raises(EnvTimeoutError, match=r"no reply to 'step' within 0\.5s"):
                    await client.step(big)
                await client.close()
            with pytest.raises(SessionClosedError):
                await client.step(Ping())
        await slots_free(url)  # the proxy cut the server's side on exit


@pytest.mark.parametrize("given_up", ["timed out", "cancelled"])
async def test_after_a_call_given_up_on_each_call_gets_its_own_reply(given_up: str) -> None:
    holding = Holding(max_envs=1)
    with run_server(holding.app) as url:
        client = WebSocketEnvClient(url, action_cls=Hold, observation_cls=Held)
        await client.reset()
        if given_up == "timed out":
            client.message_timeout = 0.2
            with pytest.raises(EnvTimeoutError):
                await client.step(Hold(wait=True))
            client.message_timeout = 60
        else:
            step = asyncio.ensure_future(client.step(Hold(wait=True)))
            await holding.until_entered()
            step.cancel()
            with pytest.raises(asyncio.CancelledError):
                await step
        holding.gate.set()  # the step given up on ends; its reply comes late
        # v1 replies carry no id: the late one must not pass for the next call's.
        steps = [(await client.step(Hold())).observation.steps for _ in range(3)]
        assert steps == [2, 3, 4]
        assert (await client.state()).step_count == 4
        await client.close()


async def test_closing_while_another_coroutines_step_hangs_returns() -> None:
    holding = Holding(max_envs=1)
    with run_server(holding.app) as url:
        # No message timeout: the close must not wait on the hung step for ever.
        client = WebSocketEnvClient(
            url, action_cls=Hold, observation_cls=Held, message_timeout=None
        )
        await client.reset()
        client.connect_timeout = 0.2  # what close() waits for the server
        step = asyncio.ensure_future(client.step(Hold(wait=True)))
        await holding.until_entered()
        await asyncio.wait_for(client.close(), 30)  # a bound for the test, not the behaviour
        with pytest.raises(SessionClosedError):
            await step
        holding.gate.set()  # the step ends; the server frees the slot
        await slots_free(url)


NOT_OPENENV_REPLIES = {
    "not JSON": ("hello", r"malformed frame from server: \(root\): Invalid JSON"),
    "binary": (b"\x00\x01", r"malformed frame from server: \(root\): Invalid JSON"),
    "a list": ("[1]", r"\(root\): Input should be an object"),
    "no data": ('{"type": "observation"}', r"observation\.data: Field required"),
    "a reward that is a word": (
        '{"type": "observation", "data": {"observation": {}, "reward": "x", "done": false}}',
        r"observation\.data\.reward: Input should be a valid number",
    ),
    "an unknown type": ('{"type": "surprise", "data": {}}', r"Input tag 'surprise'"),
    "an error with an unknown code": (
        '{"type": "error", "data": {"message": "m", "code": "NOPE"}}',
        r"error\.data\.code: Input should be 'INVALID_JSON'",
    ),
    "a reply of another type": (
        '{"type": "state", "data": {}}',
        r"expected a reply of type 'observation', got 'state'",
    ),
}


@pytest.mark.parametrize(
    ("reply", "named"), NOT_OPENENV_REPLIES.values(), ids=NOT_OPENENV_REPLIES.keys()
)
async def test_a_reply_that_is_not_openenvs_fails_the_call_naming_what_is_wrong(
    reply: str | bytes, named: str
) -> None:
    async def answer_once(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.receive_text()
        if isinstance(reply, bytes):
            await websocket.send_bytes(reply)
        else:
            await websocket.send_text(reply)
        await websocket.receive()  # until the client leaves

    app = Starlette(routes=[WebSocketRoute("/ws", answer_once)])
    with run_server(app) as url:
        client = WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong)
        with pytest.raises(ValueError, match=named):
            await client.reset()
        await client.close()


async def test_dropped_connection_is_a_clear_error() -> None:
    app = create_app(PingEnvironment, Ping, Pong)
    with run_server(app) as url:
        client = WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong)
        await client.reset()
    with pytest.raises(SessionClosedError, match="session closed"):
        await client.state()


async def test_closed_client_cannot_be_reused(echo_url: str) -> None:
    env = EchoEnv(echo_url)
    await env.reset()
    await env.close()
    with pytest.raises(SessionClosedError, match="create a new one"):
        await env.step(EchoAction(message="x"))


async def test_wrong_action_type_is_refused_locally(echo_url: str) -> None:
    async with EchoEnv(echo_url) as env:
        with pytest.raises(TypeError, match="step\\(\\) takes a EchoAction"):
            await env.step(Ping())  # type: ignore[arg-type]


async def test_one_client_serialises_concurrent_calls(echo_url: str) -> None:
    async with EchoEnv(echo_url) as env:
        await env.reset()
        results = await asyncio.gather(*(env.step(EchoAction(message=str(i))) for i in range(10)))
    assert sorted(r.observation.echoed_message for r in results) == [str(i) for i in range(10)]


def test_client_does_not_import_the_server() -> None:
    code = (
        "import sys, openenv, openenv.client, echo_env.client; "
        "loaded = {'fastapi', 'starlette', 'uvicorn'} & set(sys.modules); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
