"""The fast WebSocket protocol against peers that abuse the connection rather than
the frame format: they flood it, or stop reading it.

Frame-format attacks (malformed frames, bad close codes, invalid UTF-8) are in
``test_wsprotocol.py``; both serve the echo app there, with real uvicorn.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import pytest
from test_wsprotocol import RawClient, address_of, echo, frame
from websockets.frames import Opcode

from openenv.server.wsprotocol import WebSocketProtocol
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
