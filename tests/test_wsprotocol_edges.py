"""The fast WebSocket protocol at the edges of a connection's life: peers that
flood it or stop reading it, and a server that shuts down under it.

Frame-format attacks (malformed frames, bad close codes, invalid UTF-8) are in
``test_wsprotocol.py``, whose raw client and echo app these tests share.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_wsprotocol import PLAIN, RawClient, address_of, echo, frame, request
from websockets.frames import Opcode

from openenv.server.wsprotocol import DIRECT, WebSocketProtocol
from openenv.testing import run_server

# More than every buffer between a client and a server that stops reading it
# can hold: the kernel's both ways (Linux autotunes them to 4 and 32 MiB at
# most, by default) and the transport's, a high-water mark and one read over.
FLOOD_CAP = 64 << 20


@pytest.fixture
def address() -> Iterator[tuple[str, int]]:
    with run_server(echo, ws=WebSocketProtocol, ws_max_size=100_000, ws_ping_interval=None) as url:
        yield address_of(url)


def flood_until_unread(sock: socket.socket, data: bytes, cap: int) -> int:
    """Send ``data`` over and over until the peer stops reading (a send blocks
    for 3 s) or ``cap`` bytes have gone; the bytes sent, whole copies of ``data``."""
    batch = data * (65536 // len(data))
    sent = 0
    sock.setblocking(False)
    try:
        while sent < cap:
            _, writable, _ = select.select([], [sock], [], 3)
            if not writable:
                break
            try:
                sent += sock.send(batch)
            except BlockingIOError:
                continue
    finally:
        sock.setblocking(True)
    remainder = -sent % len(data)
    sock.sendall(batch[len(batch) - remainder :] if remainder else b"")
    return sent + remainder


def test_a_ping_flood_from_a_peer_that_never_reads_stops_being_read(
    address: tuple[str, int],
) -> None:
    # Every ping is answered with a pong; a peer that reads none of them while
    # it keeps pinging grew the server's write buffer at its own sending rate
    # (some 6 MB a second here) until the send deadline, 30 s by default.
    client = RawClient(address)
    try:
        ping = frame(Opcode.PING, b"p" * 125)
        sent = flood_until_unread(client.sock, ping, FLOOD_CAP)
        assert sent < FLOOD_CAP, "the server kept reading pings it could not answer"
        # Reading resumes once the peer reads: every ping gets its pong.
        for _ in range(sent // len(ping)):
            assert client.read() == (Opcode.PONG, b"p" * 125)
        client.send(frame(Opcode.TEXT, b"still here"))
        assert client.read() == (Opcode.TEXT, b"still here")
    finally:
        client.close()


def test_frames_flooding_in_before_the_accept_stop_being_read() -> None:
    # Bytes that follow an upgrade request wait for the app's accept, which an
    # app may take its time over (a lookup, a queue): they were gathered there
    # for as long as the peer sent them.
    connected, go = threading.Event(), threading.Event()

    async def slow_accept(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await echo(scope, receive, send)
            return
        await receive()  # websocket.connect
        connected.set()
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 30)
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] != "websocket.disconnect":
            await send({"type": "websocket.send", "text": message.get("text")})

    with run_server(slow_accept, ws=WebSocketProtocol, ws_ping_interval=None) as url:
        client = RawClient.__new__(RawClient)  # its handshake's answer comes later
        client.sock = socket.create_connection(address_of(url), timeout=10)
        client.buffer = b""
        try:
            client.send(request(*PLAIN, target="/ws").encode())
            assert connected.wait(10)  # the request is in: what follows is early
            ping = frame(Opcode.PING, b"p" * 125)
            sent = flood_until_unread(client.sock, ping, FLOOD_CAP)
            assert sent < FLOOD_CAP, "the server kept reading frames before the accept"
            go.set()
            while b"\r\n\r\n" not in client.buffer:
                client.buffer += client.sock.recv(65536)
            head, _, client.buffer = client.buffer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101")
            for _ in range(sent // len(ping)):
                assert client.read() == (Opcode.PONG, b"p" * 125)
            client.send(frame(Opcode.TEXT, b"accepted"))
            assert client.read() == (Opcode.TEXT, b"accepted")
        finally:
            go.set()
            client.close()


@pytest.mark.parametrize("ws", [WebSocketProtocol, "websockets-sansio"], ids=["fast", "stock"])
def test_after_uvicorns_shutdown_close_nothing_more_is_sent(ws: Any) -> None:
    # uvicorn's shutdown sends close 1012 to every connection: past it a send
    # must fail (RFC 6455 5.5.1: no data frame after a close frame). The fast
    # protocol framed it on: into the void while the write buffer was empty,
    # onto the wire after the close frame while it held bytes for a slow reader.
    outcomes: list[str] = []

    async def sends_after_disconnect(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await echo(scope, receive, send)
            return
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] != "websocket.disconnect":
            await send({"type": "websocket.send", "text": message["text"]})
        channel = scope["extensions"].get(DIRECT)
        if channel is not None:
            outcomes.append(f"send_now: {channel.send_now('late')}")
        try:
            await send({"type": "websocket.send", "text": "late"})
            outcomes.append("sent")
        except Exception as exc:  # what uvicorn raises: ClientDisconnected, an OSError
            outcomes.append(type(exc).__name__)

    with contextlib.ExitStack() as server:
        url = server.enter_context(run_server(sends_after_disconnect, ws=ws, ws_ping_interval=None))
        client = RawClient(address_of(url))
        try:
            client.send(frame(Opcode.TEXT, b"hello"))
            assert client.read() == (Opcode.TEXT, b"hello")
            server.close()  # uvicorn's shutdown, with the app still running
            opcode, payload = client.read()
            assert (opcode, struct.unpack("!H", payload[:2])[0]) == (Opcode.CLOSE, 1012)
            assert client.sock.recv(1) == b""
        finally:
            client.close()
    expected = ["ClientDisconnected"]
    if ws is WebSocketProtocol:
        expected.insert(0, "send_now: False")
    assert outcomes == expected
