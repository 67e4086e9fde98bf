"""The fast WebSocket protocol, byte by byte: every frame shape a client may send.

An echo app is served by real uvicorn with ``WebSocketProtocol``; a raw TCP
client sends hand-built frames (split anywhere, fragmented, interleaved with
control frames, oversized, malformed) and reads the server's frames back.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import hashlib
import json
import os
import socket
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from servers import live_ws_protocol
from websockets.frames import Opcode

from openenv.server.wsprotocol import _PARKED, DIRECT, WebSocketProtocol
from openenv.testing import run_server


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """Echo every message; after a text "close:N" frame, close with code N."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is not None and text.startswith("close:"):
            await send({"type": "websocket.close", "code": int(text[6:])})
            return
        await send({"type": "websocket.send", "text": text, "bytes": message.get("bytes")})


def address_of(url: str) -> tuple[str, int]:
    """``http://host:port`` as the (host, port) a socket connects to."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


@pytest.fixture(
    scope="module", params=[WebSocketProtocol, "websockets-sansio"], ids=["fast", "stock"]
)
def address(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    # The same expectations hold for uvicorn's own protocol: the fast one changes nothing else.
    with run_server(echo, ws=request.param, ws_max_size=100_000, ws_ping_interval=None) as url:
        yield address_of(url)


def frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    """A client frame as the RFC lays it out."""
    head = bytes([(0x80 if fin else 0) | opcode])
    length = len(payload)
    bit = 0x80 if mask else 0
    if length < 126:
        head += bytes([bit | length])
    elif length < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", length)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", length)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class RawClient:
    """A WebSocket client with no library in between: bytes in, frames out."""

    def __init__(
        self,
        address: tuple[str, int],
        extensions: str | None = None,
        *,
        request: str | None = None,
        upgraded: bool = True,
    ) -> None:
        """Connect and handshake; ``request`` replaces the default one, and with
        ``upgraded=False`` the server may refuse it."""
        self.sock = socket.create_connection(address, timeout=10)
        if request is None:
            key = base64.b64encode(os.urandom(16)).decode()
            request = (
                f"GET /ws HTTP/1.1\r\nHost: {address[0]}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n"
            )
            if extensions:
                request += f"Sec-WebSocket-Extensions: {extensions}\r\n"
            request += "\r\n"
        self.sock.sendall(request.encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        if upgraded:
            assert head.startswith(b"HTTP/1.1 101"), head
        self.handshake = head.decode()
        self.status, *lines = self.handshake.split("\r\n")
        self.headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines)
        }

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        return chunk

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self.buffer += self._recv()
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def read(self) -> tuple[int, bytes]:
        """The next frame from the server: (opcode, payload)."""
        first, second = self._take(2)
        assert second & 0x80 == 0, "server frames are never masked"
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", self._take(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", self._take(8))[0]
        assert first & 0x80, "the server sends whole messages"
        return first & 0x0F, self._take(length)

    def close_code(self) -> int:
        """Read until the server's close frame; its status code."""
        while True:
            opcode, payload = self.read()
            if opcode == Opcode.CLOSE:
                return int(struct.unpack("!H", payload[:2])[0])

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def client(address: tuple[str, int]) -> Iterator[RawClient]:
    raw = RawClient(address)
    yield raw
    raw.close()


def test_text_and_binary_round_trip(client: RawClient) -> None:
    client.send(frame(Opcode.TEXT, "héllo".encode()))
    assert client.read() == (Opcode.TEXT, "héllo".encode())
    client.send(frame(Opcode.BINARY, b"\x00\xff"))
    assert client.read() == (Opcode.BINARY, b"\x00\xff")


def test_frames_split_at_every_byte(client: RawClient) -> None:
    data = frame(Opcode.TEXT, b"split") + frame(Opcode.TEXT, b"x" * 300)
    for i in range(len(data)):
        client.send(data[i : i + 1])
        client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    assert client.read() == (Opcode.TEXT, b"split")
    assert client.read() == (Opcode.TEXT, b"x" * 300)


def test_many_frames_in_one_write_keep_their_order(client: RawClient) -> None:
    client.send(b"".join(frame(Opcode.TEXT, str(i).encode()) for i in range(100)))
    assert [client.read()[1] for _ in range(100)] == [str(i).encode() for i in range(100)]


@pytest.mark.parametrize("size", [125, 126, 65535, 65536, 99_999])
def test_every_length_encoding(client: RawClient, size: int) -> None:
    payload = os.urandom(size)
    client.send(frame(Opcode.BINARY, payload))
    assert client.read() == (Opcode.BINARY, payload)


def test_fragmented_message_with_a_ping_in_between(client: RawClient) -> None:
    client.send(frame(Opcode.TEXT, b"frag", fin=False))
    client.send(frame(Opcode.PING, b"are you there"))
    client.send(frame(Opcode.CONT, b"men", fin=False) + frame(Opcode.CONT, b"ted"))
    client.send(frame(Opcode.TEXT, b"after"))
    assert client.read() == (Opcode.PONG, b"are you there")
    assert client.read() == (Opcode.TEXT, b"fragmented")
    assert client.read() == (Opcode.TEXT, b"after")


def test_client_close_is_answered(client: RawClient) -> None:
    client.send(frame(Opcode.TEXT, b"bye"))
    assert client.read() == (Opcode.TEXT, b"bye")
    client.send(frame(Opcode.CLOSE, struct.pack("!H", 1000)))
    assert client.close_code() == 1000
    assert client.sock.recv(1) == b""


def test_server_close_discards_later_frames(client: RawClient) -> None:
    client.send(frame(Opcode.TEXT, b"close:4000") + frame(Opcode.TEXT, b"ignored"))
    opcode, payload = client.read()
    assert (opcode, struct.unpack("!H", payload[:2])[0]) == (Opcode.CLOSE, 4000)
    client.send(frame(Opcode.CLOSE, struct.pack("!H", 4000)))
    assert client.sock.recv(1) == b""  # the server closed the TCP connection, nothing else


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(Opcode.TEXT, b"\xff\xfe"), 1007),  # not UTF-8
        (frame(Opcode.TEXT, b"unmasked", mask=False), 1002),
        (frame(Opcode.BINARY, b"x" * 100_001), 1009),  # over ws_max_size
        (frame(Opcode.CONT, b"nothing to continue"), 1002),
        (bytes([0x80 | 0x40 | Opcode.TEXT, 0x80]) + b"\0\0\0\0", 1002),  # RSV1 unnegotiated
    ],
    ids=["invalid-utf8", "unmasked", "too-big", "stray-continuation", "rsv-bit"],
)
def test_protocol_errors_close_with_their_code(client: RawClient, data: bytes, code: int) -> None:
    client.send(frame(Opcode.TEXT, b"fine"))
    assert client.read() == (Opcode.TEXT, b"fine")
    client.send(data)
    assert client.close_code() == code


def test_oversized_frame_is_refused_from_its_header(client: RawClient) -> None:
    # Only the header of a frame over the limit arrives: the close must not
    # wait for (or buffer) the rest.
    client.send(bytes([0x80 | Opcode.BINARY, 0x80 | 127]) + struct.pack("!Q", 2**40))
    assert client.close_code() == 1009


def test_compressed_connections_still_work(address: tuple[str, int]) -> None:
    raw = RawClient(address, extensions="permessage-deflate; client_max_window_bits")
    try:
        assert "permessage-deflate" in raw.handshake.lower()
        raw.send(frame(Opcode.TEXT, b"plain"))  # RSV1 unset: an uncompressed message
        opcode, payload = raw.read()
        assert opcode == Opcode.TEXT
        # The reply is compressed (RSV1): websockets kept the extension's side.
        assert zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff") == b"plain"
    finally:
        raw.close()


# -- the handshake ----------------------------------------------------------
#
# The fast protocol accepts a plain upgrade request itself and leaves every
# other one to websockets: what a client sees, and what the app's scope says,
# must be what uvicorn's own protocol gives.


async def show_scope(scope: Any, receive: Any, send: Any) -> None:
    """Accept with the first subprotocol offered and a header, then send the scope back.

    Offered "refuse" first, it closes before accepting (uvicorn answers 403);
    offered "deny", it answers 401 itself (the denial response extension).
    """
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await receive()  # websocket.connect
    offered = scope["subprotocols"]
    if offered and offered[0] == "refuse":
        await send({"type": "websocket.close", "code": 1000})
        return
    if offered and offered[0] == "deny":
        await send({"type": "websocket.http.response.start", "status": 401, "headers": []})
        await send({"type": "websocket.http.response.body", "body": b"no"})
        return
    subprotocol = offered[0] if offered else None
    await send(
        {"type": "websocket.accept", "subprotocol": subprotocol, "headers": [(b"X-Id", b"7")]}
    )
    shown = {
        key: value.decode("latin-1") if isinstance(value, bytes) else value
        for key, value in scope.items()
        if key not in ("app", "state", "client", "server", "headers", "extensions")
    }
    shown["hosts"] = [scope["client"][0], scope["server"][0]]  # the ports differ
    shown["headers"] = [
        [name.decode(), value.decode("latin-1")] for name, value in scope["headers"]
    ]
    shown["extensions"] = sorted(set(scope["extensions"]) - {DIRECT})
    await send({"type": "websocket.send", "text": json.dumps(shown)})
    while (await receive())["type"] != "websocket.disconnect":
        pass


@pytest.fixture(scope="module")
def both() -> Iterator[dict[str, tuple[str, int]]]:
    """``show_scope`` served by the fast protocol and by uvicorn's own."""
    with (
        run_server(show_scope, ws=WebSocketProtocol, ws_ping_interval=None) as fast,
        run_server(show_scope, ws="websockets-sansio", ws_ping_interval=None) as stock,
    ):
        yield {"fast": address_of(fast), "stock": address_of(stock)}


def request(*headers: str, target: str = "/ws/a%20b?x=1&y=%C3%A9") -> str:
    return f"GET {target} HTTP/1.1\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n"


KEY = base64.b64encode(b"sixteen byte key").decode()
UPGRADE = ["Host: example.com", "Upgrade: WebSocket", "Connection: keep-alive, Upgrade"]
PLAIN = [*UPGRADE, f"Sec-WebSocket-Key: {KEY}", "Sec-WebSocket-Version: 13"]


def test_a_plain_handshake_is_answered_and_scoped_as_uvicorn_does(
    both: dict[str, tuple[str, int]],
) -> None:
    headers = [*PLAIN, "Sec-WebSocket-Protocol: openenv, other", "X-Spaced: \t two words "]
    seen = {}
    for name, address in both.items():
        raw = RawClient(address, request=request(*headers))
        try:
            scope = json.loads(raw.read()[1])
            if name == "fast":  # and websockets never saw this handshake
                assert live_ws_protocol().conn.accept_called is False
        finally:
            raw.close()
        response = {k: v for k, v in raw.headers.items() if k != "date"}
        seen[name] = (raw.status, response, scope)
    assert seen["fast"] == seen["stock"]
    status, response, scope = seen["fast"]
    assert status == "HTTP/1.1 101 Switching Protocols"
    digest = hashlib.sha1((KEY + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
    assert response["sec-websocket-accept"] == base64.b64encode(digest).decode()
    assert response["sec-websocket-protocol"] == "openenv"
    assert response["x-id"] == "7"
    assert (scope["path"], scope["raw_path"], scope["query_string"]) == (
        "/ws/a b",
        "/ws/a%20b",
        "x=1&y=%C3%A9",
    )
    assert scope["subprotocols"] == ["openenv", "other"]
    assert ["x-spaced", "two words"] in scope["headers"]


@pytest.mark.parametrize(
    "headers",
    [
        [*UPGRADE, f"Sec-WebSocket-Key: {KEY}", "Sec-WebSocket-Version: 8"],
        [*UPGRADE, f"Sec-WebSocket-Key: {KEY}"],
        [*UPGRADE, "Sec-WebSocket-Key: not base64!", "Sec-WebSocket-Version: 13"],
        [*UPGRADE, "Sec-WebSocket-Key: c2hvcnQ=", "Sec-WebSocket-Version: 13"],
        [*PLAIN, f"Sec-WebSocket-Key: {KEY}"],
        [*UPGRADE, "Sec-WebSocket-Version: 13"],
        [*PLAIN, "Sec-WebSocket-Protocol: refuse"],
        [*PLAIN, "Sec-WebSocket-Protocol: deny"],
    ],
    ids=[
        "version",
        "no-version",
        "bad-key",
        "short-key",
        "two-keys",
        "no-key",
        "app-refuses",
        "app-denies",
    ],
)
def test_a_refused_handshake_is_refused_as_uvicorn_does(
    both: dict[str, tuple[str, int]], headers: list[str]
) -> None:
    statuses = {}
    for name, address in both.items():
        raw = RawClient(address, request=request(*headers), upgraded=False)
        raw.close()
        statuses[name] = raw.status
    assert statuses["fast"] == statuses["stock"]
    assert statuses["fast"].split()[1] in {"400", "401", "403"}


@pytest.mark.parametrize(
    ("headers", "body", "why"),
    [
        ([*PLAIN, "Content-Length: 5"], "hello", "unsupported request body"),
        (
            [*PLAIN, "Transfer-Encoding: chunked"],
            "5\r\nhello\r\n0\r\n\r\n",
            "transfer codings aren't supported",
        ),
    ],
    ids=["content-length", "chunked"],
)
def test_an_upgrade_request_with_a_body_is_answered_and_closed(
    both: dict[str, tuple[str, int]], headers: list[str], body: str, why: str
) -> None:
    """websockets cannot parse an upgrade request with a body: it is answered 400
    and its connection closed, not left open for as long as the client likes.
    uvicorn's own protocol leaves it open (websockets-sansio writes nothing), so
    this tests the fast protocol alone."""
    raw = RawClient(both["fast"], request=request(*headers) + body, upgraded=False)
    try:
        assert raw.status == "HTTP/1.1 400 Bad Request"
        while chunk := raw.sock.recv(65536):  # to the server's close (its 10 s timeout fails)
            raw.buffer += chunk
        assert raw.buffer.decode() == f"Failed to open a WebSocket connection: {why}.\n"
    finally:
        raw.close()


def test_frames_sent_before_the_accept_are_kept() -> None:
    # A client may send frames right behind its request; those that arrive
    # before the app accepts wait for websockets' parser, as on the stock path.
    go = threading.Event()

    async def late_accept(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await echo(scope, receive, send)
            return
        await receive()  # websocket.connect
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] != "websocket.disconnect":
            await send({"type": "websocket.send", "text": message.get("text")})

    with run_server(late_accept, ws=WebSocketProtocol, ws_ping_interval=None) as url:
        sock = socket.create_connection(address_of(url), timeout=10)
        try:
            sock.sendall(request(*PLAIN, target="/ws").encode())
            server_side = until_protocol(lambda p: p.handshake_initiated)
            sock.sendall(frame(Opcode.TEXT, b"early"))
            until_protocol(lambda p: bool(p._early))
            go.set()
            raw = RawClient.__new__(RawClient)
            raw.sock, raw.buffer = sock, b""
            while b"\r\n\r\n" not in raw.buffer:
                raw.buffer += raw._recv()
            head, _, raw.buffer = raw.buffer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101")
            assert raw.read() == (Opcode.TEXT, b"early")
            raw.send(frame(Opcode.TEXT, b"later"))
            assert raw.read() == (Opcode.TEXT, b"later")
            assert not server_side._framing  # websockets frames this connection to the end
        finally:
            go.set()
            sock.close()


def until_protocol(ready: Any) -> Any:
    """The server's one ``WebSocketProtocol`` once ``ready(it)``; polls the server thread."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [o for o in gc.get_objects() if type(o) is WebSocketProtocol and not o.disconnected]
        if len(found) == 1 and ready(found[0]):
            return found[0]
        time.sleep(0.01)  # polling the server thread's progress, not a delay
    raise AssertionError("the server's protocol never got there")


def test_websockets_parser_rests_between_frames() -> None:
    # websockets' parser (some 3 KiB of suspended generators) is dropped while
    # frames are split here, and a new one takes over for any other frame.
    with run_server(echo, ws=WebSocketProtocol, ws_ping_interval=None) as url:
        raw = RawClient(address_of(url))
        try:
            raw.send(frame(Opcode.TEXT, b"first"))
            assert raw.read() == (Opcode.TEXT, b"first")
            server_side = live_ws_protocol()
            assert server_side.conn.parser is _PARKED
            raw.send(frame(Opcode.PING, b"ping"))
            assert raw.read() == (Opcode.PONG, b"ping")
            assert server_side.conn.parser is _PARKED
            raw.send(frame(Opcode.TEXT, b"half ", fin=False))
            raw.send(frame(Opcode.CONT, b"and half"))
            assert raw.read() == (Opcode.TEXT, b"half and half")
            assert server_side.conn.parser is _PARKED
            raw.send(frame(Opcode.CLOSE, struct.pack("!H", 1000)))
            assert raw.close_code() == 1000
        finally:
            raw.close()


def test_a_closed_connection_is_freed_without_the_collector() -> None:
    # Reference cycles through the protocol (its parser, the scope's direct
    # channel) kept every closed connection's buffers until a collection.
    gc.disable()
    try:
        with run_server(echo, ws=WebSocketProtocol, ws_ping_interval=None) as url:
            raw = RawClient(address_of(url))
            try:
                raw.send(frame(Opcode.TEXT, b"hello"))
                assert raw.read() == (Opcode.TEXT, b"hello")
                server_side = live_ws_protocol()
                freed = weakref.ref(server_side)
                del server_side
                raw.send(frame(Opcode.CLOSE, struct.pack("!H", 1000)))
                assert raw.close_code() == 1000
            finally:
                raw.close()
            deadline = time.monotonic() + 10
            while freed() is not None and time.monotonic() < deadline:
                time.sleep(0.01)  # polling the server thread's progress, not a delay
            assert freed() is None
    finally:
        gc.enable()
