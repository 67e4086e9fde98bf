"""A WebSocket connection driven in the caller's own thread, for strict request/reply.

``websockets.sync.client`` reads the socket on a background thread and hands
each message to the caller through a condition: right for a connection that
receives while its owner does other things, but on a call that waits for its
reply, every reply costs a thread wake-up and a GIL hand-over on top of the
socket's. ``BlockingWebSocket`` runs websockets' public sans-I/O
``ClientProtocol`` on a blocking socket in the thread that calls ``recv``, so
a reply is parsed by the thread waiting for it.

Between calls nobody reads, yet the server's keepalive pings must be
answered: a daemon thread looks every ``keepalive`` seconds and, when no call
holds the connection, reads what arrived (answering pings; keeping any
message for the next ``recv``).

>>> BlockingWebSocket("ws://127.0.0.1:9/ws", open_timeout=1.0)  # nothing listens on port 9
Traceback (most recent call last):
...
ConnectionRefusedError: [Errno 111] Connection refused
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, ConnectionClosedError
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from openenv.client._base import ssl_context as default_ssl_context

__all__ = ["BlockingWebSocket"]

# Bytes read at a time, into one buffer per connection: a busy-polling recv
# makes no allocation per attempt.
_READ = 1 << 16
# What a non-blocking read raises when nothing has come (a TLS socket: SSLWantReadError).
_NOTHING_YET = (BlockingIOError, InterruptedError, ssl.SSLWantReadError)
_CLOSE_TIMEOUT = 2.0


class BlockingWebSocket:
    """One client WebSocket whose ``send`` and ``recv`` run in the caller's thread.

    Args:
        url: A ``ws://`` or ``wss://`` address.
        headers: Extra request headers of the opening handshake.
        open_timeout: Seconds for the TCP connect and the handshake.
        max_size: Largest message accepted, in bytes.
        subprotocols: Subprotocols offered in the handshake.
        keepalive: How often, in seconds, an idle connection reads to answer pings.
        busy_poll: Seconds ``recv`` reads without sleeping before it blocks, while
            messages usually come that soon (0: never). Polling keeps the
            waiting core awake, which saves the wake-up of an idle core when the
            reply comes (tens of microseconds on a VM), at the cost of that
            core while it waits.
        ssl_context: For ``wss://`` (default: the clients' shared one, httpx's CA bundle).
        send_timeout: Seconds a message may take to be written (a server that stopped
            reading); past it the connection is dropped, as a frame cut short
            leaves it unusable (``None``: no limit).

    Raises ``OSError`` (``TimeoutError`` included) if it cannot connect, and
    websockets' ``InvalidHandshake`` errors if the server refuses the handshake.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        open_timeout: float = 10.0,
        max_size: int = 2**26,
        subprotocols: Sequence[str] | None = None,
        keepalive: float = 5.0,
        busy_poll: float = 0.0,
        ssl_context: ssl.SSLContext | None = None,
        send_timeout: float | None = 60.0,
    ) -> None:
        uri = parse_uri(url)
        self._protocol = ClientProtocol(
            uri,
            max_size=max_size,
            subprotocols=[Subprotocol(s) for s in subprotocols] if subprotocols else None,
        )
        self._busy_poll = busy_poll
        self._send_timeout = send_timeout
        self._typical = 0.0  # how long recv waited for a message, smoothed
        self._buffer = bytearray(_READ)
        self._view = memoryview(self._buffer)
        self._messages: deque[str | bytes] = deque()
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self._lock = threading.Lock()  # one thread at a time drives the protocol
        self._stop = threading.Event()
        self._sock = socket.create_connection((uri.host, uri.port), timeout=open_timeout)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if uri.secure:
                context = ssl_context if ssl_context is not None else default_ssl_context()
                self._sock = context.wrap_socket(self._sock, server_hostname=uri.host)
            request = self._protocol.connect()
            for name, value in (headers or {}).items():
                request.headers[name] = value
            self._protocol.send_request(request)
            self._flush()
            deadline = time.monotonic() + open_timeout
            while self._protocol.state is State.CONNECTING:
                self._read_once(deadline)
            if self._protocol.handshake_exc is not None:
                raise self._protocol.handshake_exc
        except BaseException:
            self._sock.close()
            raise
        # The keeper holds this object weakly: one dropped unclosed is collected,
        # and its socket closed (the server frees its sessions), not kept open
        # by its own keepalive for the life of the process.
        self._keeper = threading.Thread(
            target=_keep_alive,
            args=(weakref.ref(self), self._stop, keepalive),
            name="openenv-ws-keepalive",
            daemon=True,
        )
        self._on_drop = weakref.finalize(self, _dropped, self._stop, self._sock)
        self._keeper.start()

    @property
    def subprotocol(self) -> str | None:
        """The subprotocol the server chose, if any."""
        return self._protocol.subprotocol

    def send(self, message: str) -> None:
        """Send one text message; ``ConnectionClosed`` if the connection is closed."""
        with self._lock:
            if self._protocol.state is not State.OPEN:
                raise self._closed()
            self._protocol.send_text(message.encode())
            self._flush()
            if self._protocol.state is not State.OPEN:
                raise self._closed()

    def recv(self, timeout: float | None = None) -> str | bytes:
        """The next message; ``TimeoutError`` after ``timeout`` seconds without one,
        ``ConnectionClosed`` once the connection has closed and nothing is left."""
        with self._lock:
            if self._messages:
                return self._messages.popleft()
            started = time.monotonic()
            deadline = None if timeout is None else started + timeout
            if self._typical < self._busy_poll:
                self._poll(started + min(self._busy_poll, timeout or self._busy_poll))
            while not self._messages:
                if self._protocol.state is not State.OPEN:
                    raise self._closed()
                self._read_once(deadline)
            # How long a reply takes, smoothed: polling pays only while replies
            # come within busy_poll, and stops while they take longer.
            self._typical += (time.monotonic() - started - self._typical) / 8
            return self._messages.popleft()

    def _poll(self, until: float) -> None:
        """Read without sleeping until a message comes, or ``until``."""
        self._sock.settimeout(0.0)
        while not self._messages and self._protocol.state is State.OPEN:
            try:
                data = self._receive()
            except _NOTHING_YET:
                if time.monotonic() >= until:
                    return
                continue
            except OSError:  # reset by the peer: as the end of the stream
                data = b""
            self._feed(data)

    def close(self) -> None:
        """Close the connection (the closing handshake, at most two seconds); idempotent."""
        self._on_drop.detach()
        self._stop.set()
        with self._lock:
            try:
                if self._protocol.state is State.OPEN:
                    self._protocol.send_close()
                    self._flush()
                deadline = time.monotonic() + _CLOSE_TIMEOUT
                while self._protocol.state is not State.CLOSED:
                    self._read_once(deadline)
            except (OSError, ConnectionClosed):
                pass
            finally:
                self._sock.close()
        if threading.current_thread() is not self._keeper:
            self._keeper.join()

    # -- the protocol, driven by whichever thread holds the lock ------------------

    def _read_once(self, deadline: float | None) -> None:
        """Wait for bytes until ``deadline`` (``TimeoutError`` past it) and feed them."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError("no message in time")
        self._sock.settimeout(remaining)
        try:
            data = self._receive()
        except TimeoutError:
            raise TimeoutError("no message in time") from None
        except OSError:  # reset by the peer: as the end of the stream
            data = b""
        self._feed(data)

    def _receive(self) -> bytes:
        """What the socket has now (``b""``: the end of the stream), as its timeout allows."""
        count = self._sock.recv_into(self._buffer)
        return self._view[:count].tobytes()

    def _feed(self, data: bytes) -> None:
        protocol = self._protocol
        if data:
            protocol.receive_data(data)
        else:
            protocol.receive_eof()
        for event in protocol.events_received():
            if not isinstance(event, Frame):
                continue  # the handshake's response: the protocol has taken it in
            opcode = event.opcode
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                self._fragment_text = opcode is Opcode.TEXT
                self._fragments = [bytes(event.data)]
            elif opcode is Opcode.CONT:
                self._fragments.append(bytes(event.data))
            else:
                continue  # ping (answered by the protocol), pong, close
            if event.fin:
                whole = b"".join(self._fragments)
                self._fragments = []
                self._messages.append(whole.decode() if self._fragment_text else whole)
        self._flush()

    def _flush(self) -> None:
        chunks = self._protocol.data_to_send()
        if not chunks:
            return
        # The socket has a read's timeout on it: none left, or 0 while recv
        # busy-polls, which would fail a send larger than the socket's buffer.
        left = self._sock.gettimeout()
        if left != self._send_timeout:
            self._sock.settimeout(self._send_timeout)
        try:
            for chunk in chunks:
                if chunk:
                    self._sock.sendall(chunk)
                else:  # the protocol's end of stream: half-close
                    self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            # The peer is gone (or takes nothing, past send_timeout): as the end
            # of the stream, which the next send or recv reports as ConnectionClosed.
            self._protocol.receive_eof()
            self._protocol.data_to_send()
        finally:
            if left != self._send_timeout:
                self._sock.settimeout(left)

    def _closed(self) -> ConnectionClosed:
        protocol = self._protocol
        if protocol.state is State.CLOSED:
            return protocol.close_exc
        return ConnectionClosedError(
            protocol.close_rcvd, protocol.close_sent, protocol.close_rcvd_then_sent
        )

    def _keep_once(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # a call is reading: it answers the pings itself
        try:
            self._poll(until=0.0)  # what has come, without waiting for more
        except (OSError, ConnectionClosed):
            pass  # the next call hears of it
        finally:
            self._lock.release()


def _keep_alive(ws: weakref.ref[BlockingWebSocket], stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        alive = ws()
        if alive is None:
            return
        alive._keep_once()
        del alive  # not held while waiting: the connection may be dropped meanwhile


def _dropped(stop: threading.Event, sock: socket.socket) -> None:
    stop.set()
    sock.close()
