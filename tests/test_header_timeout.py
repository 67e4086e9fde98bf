"""Connections that never finish a request are dropped; sessions past their handshake are not."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest
from servers import Ping, PingEnvironment, Pong
from test_wsprotocol import RawClient, frame

from openenv import ConcurrencyConfig, create_app
from openenv.server.httpprotocol import HttpToolsProtocol
from openenv.server.runner import uvicorn_config
from openenv.testing import run_server


class QuickHeaders(HttpToolsProtocol):
    header_timeout = 0.3


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    app = create_app(PingEnvironment, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app, http=QuickHeaders) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` (within the socket's own 10-s bound)."""
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    finally:
        sock.close()


def test_silent_and_half_sent_connections_are_closed(address: tuple[str, int]) -> None:
    # A session whose handshake completed is not bound by the header deadline.
    session = RawClient(address)
    silent, half_sent, half_http = [], [], []
    for _ in range(40):
        silent.append(socket.create_connection(address, timeout=10))
        sock = socket.create_connection(address, timeout=10)
        sock.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
        half_sent.append(sock)
    for _ in range(10):
        sock = socket.create_connection(address, timeout=10)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        half_http.append(sock)
    assert all(closed_by_server(sock) for sock in silent + half_sent + half_http)
    # Each of those waited out the deadline after the session's handshake; it goes on.
    session.send(frame(0x1, b'{"type": "state"}'))
    assert orjson.loads(session.read()[1])["type"] == "state"
    session.close()
    # And the server still serves whole requests.
    assert httpx.get(f"http://{address[0]}:{address[1]}/health").status_code == 200


def test_a_kept_alive_connection_gets_a_deadline_for_each_request(
    address: tuple[str, int],
) -> None:
    sock = socket.create_connection(address, timeout=10)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
    assert closed_by_server(sock)


def test_openenv_serve_uses_it() -> None:
    assert uvicorn_config(object()).http is HttpToolsProtocol


@pytest.mark.parametrize("where", ["value", "url"])
def test_headers_past_max_header_bytes_get_431_and_a_close(where: str) -> None:
    """httptools gathers a header (or the URL) into one string, a copy per piece
    received: a client streaming one for ever would hold the event loop, so it
    is cut off past ``max_header_bytes`` (1 MiB), with 431."""
    app = create_app(PingEnvironment, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
                if where == "value"
                else b"GET /health?"
            )
            piece, sent = b"a" * 65536, 0
            with contextlib.suppress(ConnectionError):  # it may close before all is sent
                while sent <= 4 << 20:
                    sock.sendall(piece)
                    sent += len(piece)
            reply = b""
            while chunk := sock.recv(65536):  # to the server's close (a timeout fails)
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
        assert reply.endswith(b"request headers over 1048576 bytes")
        # A large header under the limit is still served, and so is everyone else.
        big = httpx.get(f"{url}/health", headers={"X-Big": "a" * 500_000})
        assert big.status_code == 200
