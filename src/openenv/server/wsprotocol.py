"""uvicorn's WebSocket protocol, with fast paths for the handshake and the frames
sessions exchange.

A step is one small text frame in and one out. uvicorn's ``websockets-sansio``
protocol runs each through websockets' generator-based parser and frame
objects, queues it on an ``asyncio.Queue``, and stops and restarts reading
the socket around every message: together more CPU than the whole session
logic. A connect costs as much again: websockets parses the request uvicorn
has parsed already, and builds the response through header objects.
``WebSocketProtocol`` keeps that protocol for everything (refused or
negotiated handshakes, control frames, fragments, compression, closing,
limits, errors) and only takes over the common case:

- the handshake: a plain, valid upgrade request (no extension offered
  while compression is on) is checked and accepted here, with websockets'
  rules; any other request goes to websockets, which answers it as before;
- incoming: a whole, final, masked text or binary frame within the size
  limit is unmasked (websockets' C helper) and queued directly; every other
  frame is handed to websockets whole, so its parser always starts on a
  frame boundary and keeps full control of the protocol;
- outgoing: a text or binary message on an open, uncompressed connection is
  framed with one header and written at once;
- flow control: reading pauses only when more than ``ws_max_queue``
  messages wait for the app, not after each one, and while the peer leaves
  the write buffer full (``server/wsflow.py``);
- memory: websockets' frame parser, idle between the frames it is handed,
  is dropped and made anew when the next one comes (about 3 KiB a session);
- send deadline: a peer that leaves the write buffer full for
  ``send_timeout`` seconds is aborted (``server/wsflow.py``);
- a direct channel (the ``openenv.direct`` ASGI extension): an app that
  takes it may handle a data frame in the protocol's own callback and send
  its reply without a task, which is how a session serves a plain ``def``
  step without waking its coroutine twice (see ``server/endpoint.py``).

It is the default of ``openenv serve`` and ``openenv.serve``; with plain
uvicorn, pass ``--ws openenv.server.wsprotocol:WebSocketProtocol``.
"""

from __future__ import annotations

import binascii
import logging
from base64 import b64decode
from collections.abc import Callable, Generator
from typing import Any
from urllib.parse import unquote

from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from websockets.protocol import State

from openenv.server.direct import DIRECT, NOTIFY, DirectChannel
from openenv.server.wsflow import FlowControlled
from openenv.server.wsqueues import Inbox

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C extension
    from websockets.utils import apply_mask
from websockets.utils import accept_key

__all__ = ["DIRECT", "NOTIFY", "DirectChannel", "WebSocketProtocol"]


_OPEN = State.OPEN
_INFO = logging.INFO
# Request headers the handshake reads, each of which must come once; a request
# with a body, or with any of these twice, is left to websockets to answer.
_ONCE = frozenset(
    {
        b"connection",
        b"upgrade",
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-extensions",
        b"content-length",
        b"transfer-encoding",
    }
)
_SWITCHING = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
_FIN_TEXT = 0x81  # FIN, no RSV bits, opcode 1
_FIN_BINARY = 0x82


class WebSocketProtocol(FlowControlled):
    """uvicorn's ``websockets-sansio`` protocol with fast paths for small data frames."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Bytes of an incomplete frame, kept until the rest arrives.
        self._partial = b""
        # Bytes still owed to websockets to finish a frame it was handed in part.
        self._passthrough = 0
        # Whether this connection's frames are split here; set once the handshake
        # is accepted with websockets' parser waiting at a frame boundary.
        self._framing = False
        self._unframed_bytes = False
        self._direct: Callable[[str | bytes], bool] | None = None
        # Set while a handshake accepted here waits for the app's accept.
        self._accept_key: bytes | None = None
        self._early = b""  # bytes that came after that request, before the accept

    # -- the direct channel -------------------------------------------------

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # none when the handshake was refused
        if scope is not None:
            scope["extensions"][DIRECT] = self

    def take_frames(self, handler: Callable[[str | bytes], bool] | None) -> None:
        self._direct = handler

    def send_now(self, text: str) -> bool:
        if not self._framing or self.close_sent or self.disconnected:
            return False
        payload = text.encode()
        self.transport.write(_header(_FIN_TEXT, len(payload)) + payload)
        return True

    def send_text(self, text: str) -> bool:
        if not self.writable.is_set():
            return False  # send() waits for the transport to drain
        return self.send_now(text)

    def write_blocked(self) -> bool:
        return not self.writable.is_set()

    def notify(self) -> None:
        inbox: Inbox = self.queue  # type: ignore[assignment]
        inbox.put_nowait({"type": NOTIFY})

    # -- incoming -----------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self._framing:
            if self.handshake_initiated:
                # Bytes after the request but before the accept: websockets owns
                # this connection's framing from here on.
                self._unframed_bytes = True
                if self._accept_key is not None:
                    self._early += data  # for websockets' frame parser, once accepted
                    if not self.read_paused:  # the app may take its time to accept
                        self.read_paused = True
                        self.transport.pause_reading()
                    return
            elif self._handshake(data):
                return
            self._websockets(data)
            exc = self.conn.handshake_exc
            if exc is not None and not self.handshake_complete:
                self._refuse_unparsed(exc)
            return
        if not self._framing_ok():
            # The close handshake has begun: websockets takes every byte from here.
            data, self._partial = self._partial + data, b""
            self._websockets(data)
            return
        if self._passthrough:
            handed = data[: self._passthrough]
            self._passthrough -= len(handed)
            data = data[len(handed) :]
            self._websockets(handed)
            if not self._framing_ok():
                if data:
                    self._websockets(data)
                return
            self._park_parser()
            if not data:
                return
        if self._partial:
            data = self._partial + data
            self._partial = b""
        self._split(data)

    # -- the handshake ------------------------------------------------------

    def _handshake(self, data: bytes) -> bool:
        """Take the upgrade request uvicorn hands over, if it is a plain, valid one.

        uvicorn has parsed the request already and passes it on re-serialized:
        one line per header, names in lower case. Checks are websockets' own
        (``ServerProtocol.process_request``); whatever they would refuse, and
        whatever needs negotiating, is left to websockets by returning False.
        """
        head, end, rest = data.partition(b"\r\n\r\n")
        if not end or rest:
            return False
        request_line, *lines = head.split(b"\r\n")
        method, _, rest = request_line.partition(b" ")
        target, _, protocol = rest.partition(b" ")
        if method != b"GET" or protocol != b"HTTP/1.1" or not target.isascii():
            return False
        headers: list[tuple[bytes, bytes]] = []
        once: dict[bytes, bytes] = {}
        subprotocols: list[str] = []
        for line in lines:
            name, colon, value = line.partition(b":")
            if not colon:
                return False
            name = name.lower()
            value = value.strip(b" \t")
            headers.append((name, value))
            if name in _ONCE:
                if name in once:
                    return False
                once[name] = value
            elif name == b"sec-websocket-protocol":
                subprotocols += (token.strip() for token in value.decode("latin-1").split(","))
        key = once.get(b"sec-websocket-key", b"")
        try:
            valid_key = len(b64decode(key, validate=True)) == 16
        except binascii.Error:
            valid_key = False
        connection = once.get(b"connection", b"").lower().split(b",")
        if (
            not valid_key
            or once.get(b"sec-websocket-version") != b"13"
            or once.get(b"upgrade", b"").lower() != b"websocket"
            or b"upgrade" not in (token.strip() for token in connection)
            or b"content-length" in once
            or b"transfer-encoding" in once
            or (b"sec-websocket-extensions" in once and self.config.ws_per_message_deflate)
        ):
            return False
        self._accept_key = accept_key(key.decode()).encode()
        self.handshake_initiated = True
        # The scope as uvicorn's handle_connect builds it.
        raw_path, _, query_string = target.partition(b"?")
        path = raw_path.decode()
        scope: Any = {
            "type": "websocket",
            "asgi": {"version": self.asgi_version, "spec_version": "2.4"},
            "http_version": "1.1",
            "scheme": self.scheme,
            "server": self.server,
            "client": self.client,
            "root_path": self.root_path,
            "path": self.root_path + unquote(path),
            "raw_path": self.root_path.encode("ascii") + raw_path,
            "query_string": query_string,
            "headers": headers,
            "subprotocols": subprotocols,
            "state": self.app_state.copy(),
            "extensions": {"websocket.http.response": {}, DIRECT: self},
        }
        self.scope = scope
        self.queue.put_nowait({"type": "websocket.connect"})
        task = self.loop.create_task(self.run_asgi())
        task.add_done_callback(self.on_task_complete)
        self.tasks.add(task)
        return True

    def _accept(self, message: Any) -> None:
        """Answer a handshake taken by ``_handshake`` with the app's accept."""
        if self.logger.isEnabledFor(_INFO):
            self.logger.info(
                '%s - "WebSocket %s" [accepted]',
                get_client_addr(self.scope),
                get_path_with_query_string(self.scope),
            )
        response = [_SWITCHING, b"Sec-WebSocket-Accept: ", self._accept_key or b"", b"\r\n"]
        for name, value in (*self.default_headers, *message.get("headers", ())):
            response += (name.lower(), b": ", value, b"\r\n")
        subprotocol = message.get("subprotocol")
        if subprotocol:
            response += (b"Sec-WebSocket-Protocol: ", subprotocol.encode(), b"\r\n")
        response.append(b"\r\n")
        self._accept_key = None
        if self.transport.is_closing():
            return
        self.handshake_complete = True
        conn = self.conn
        # websockets' parser still waits for a request line: retire it, so the
        # next one made parses frames.
        conn.parser.close()
        conn.parser = _PARKED
        conn.state = _OPEN
        conn.logger.info("connection open")
        self.transport.write(b"".join(response))
        self.start_keepalive()
        if self._early:
            early, self._early = self._early, b""
            self._websockets(early)
        self._resume_reading()

    def _split(self, data: bytes) -> None:
        size = len(data)
        pos = 0
        conn = self.conn
        max_size = conn.max_message_size
        queue: Inbox = self.queue  # type: ignore[assignment]
        message: dict[str, Any] | None
        while size - pos >= 2:
            first, second = data[pos], data[pos + 1]
            length = second & 0x7F
            head = pos + 2
            if length == 126:
                if size - pos < 4:
                    break
                length = int.from_bytes(data[head : head + 2])
                head += 2
            elif length == 127:
                if size - pos < 10:
                    break
                length = int.from_bytes(data[head : head + 8])
                head += 8
            masked = second & 0x80
            end = head + (4 if masked else 0) + length
            if (
                first in (_FIN_TEXT, _FIN_BINARY)
                and masked
                and end <= size
                and conn.current_size is None
                and (max_size is None or length <= max_size)
            ):
                payload = apply_mask(data[head + 4 : end], data[head : head + 4])
                frame: str | bytes | None = payload
                if first == _FIN_TEXT:
                    try:
                        frame = payload.decode()
                    except UnicodeDecodeError:
                        frame = None  # websockets closes with 1007
                if frame is not None:
                    pos = end
                    direct = self._direct
                    if (
                        direct is not None
                        and queue.empty()
                        and self.writable.is_set()
                        and direct(frame)
                    ):
                        continue
                    if first == _FIN_TEXT:
                        message = {"type": "websocket.receive", "text": frame}
                    else:
                        message = {"type": "websocket.receive", "bytes": frame}
                    queue.put_nowait(message)
                    continue
            # Anything else goes to websockets whole (or as far as it has
            # arrived), so its parser never starts mid-frame.
            if end > size and (max_size is None or length <= max_size) and size - pos < 65536:
                break  # small and incomplete: wait for the rest here
            chunk = data[pos:end]
            self._passthrough = end - pos - len(chunk)
            pos += len(chunk)
            self._websockets(chunk)
            if not self._framing_ok():
                if pos < size:
                    self._websockets(data[pos:])
                return
            self._park_parser()
        if pos < size:
            self._partial = data[pos:]
        if not self.read_paused and queue.qsize() > self._max_queue:
            self.read_paused = True
            self.transport.pause_reading()

    def _websockets(self, data: bytes) -> None:
        """Hand bytes to websockets, with a fresh frame parser if it was parked."""
        conn = self.conn
        if conn.parser is _PARKED:
            conn.parser = conn.parse()
            next(conn.parser)  # to its first wait for data, as websockets starts it
        super().data_received(data)

    def _refuse_unparsed(self, exc: Exception) -> None:
        """Answer and close an upgrade request websockets could not parse.

        websockets then has a response ready (431 for a header over its limits)
        or, for a request it cannot read (one with a body), only its end of
        stream; uvicorn's own protocol sends neither, and would leave the
        connection open for as long as the client keeps it.
        """
        conn = self.conn
        if self.transport.is_closing():
            return
        output = b"".join(conn.data_to_send())
        if not output:
            reason = exc.__cause__ or exc
            response = conn.reject(400, f"Failed to open a WebSocket connection: {reason}.\n")
            output = response.serialize()
        self.transport.write(output)
        self.transport.close()

    def _park_parser(self) -> None:
        """Drop websockets' frame parser while it idles at a frame boundary.

        It is a chain of suspended generators, some 3 KiB per connection, and
        with the frames split here it may wait for hours; between two frames
        it keeps no state of its own, so a new one can take over at any time.
        """
        conn = self.conn
        if conn.parser is not _PARKED and not self._passthrough and not conn.reader.buffer:
            conn.parser.close()
            conn.parser = _PARKED

    def _framing_ok(self) -> bool:
        """Whether the connection is still open for fast framing after websockets ran."""
        if self.conn.state is _OPEN and not self.close_sent:
            return True
        self._framing = False  # for good: only an accept turns it on
        return False

    def shutdown(self) -> None:
        # uvicorn's shutdown sends close 1012 without setting close_sent, which
        # websockets' own send path does not need (its state is CLOSING); the
        # fast one would go on framing data after that close frame.
        self._framing = False
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        # Two more references back to this protocol, from the app's handler
        # and from the scope it keeps: cycles, like the parser's below.
        self._direct = None
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"].pop(DIRECT, None)
        # websockets' parser is a generator whose frame holds its protocol: a
        # reference cycle that keeps every closed connection's buffers alive
        # until a garbage collection. Closing it lets them go at once.
        self.conn.parser.close()

    # -- outgoing -----------------------------------------------------------

    async def send(self, message: Any) -> None:
        if (
            self._accept_key is not None
            and message["type"] == "websocket.accept"
            and not self.handshake_complete
            and self.initial_response is None
        ):
            await self.writable.wait()
            if not self.disconnected:
                self._accept(message)
                self._start_framing()
                return
        if (
            self._framing
            and message["type"] == "websocket.send"
            and not self.close_sent  # set by every way of closing but the peer's,
            and not self.disconnected  # which ends _framing as its frame arrives
            and self.writable.is_set()
        ):
            text = message.get("text")
            if text is not None and message.get("bytes") is None:
                payload = text.encode()
                first = _FIN_TEXT
            else:
                payload = message.get("bytes")
                first = _FIN_BINARY
            if payload is not None:
                self.transport.write(_header(first, len(payload)) + payload)
                return
        await super().send(message)
        if message["type"] == "websocket.accept":
            # The handshake's request and response (headers and all) are not
            # needed again; the app's scope keeps the request headers.
            self.request = self.response = None  # type: ignore[assignment]
            self._start_framing()

    def _start_framing(self) -> None:
        """After an accept: split frames here if websockets' parser waits at a frame
        boundary (no bytes came before the accept) and nothing was negotiated."""
        if not self._unframed_bytes and self.conn.state is _OPEN and not self.conn.extensions:
            self._framing = True
            self._park_parser()


def _parked() -> Generator[None]:
    yield  # never run: a placeholder for websockets' parser, told apart by identity


_PARKED = _parked()


def _header(first: int, length: int) -> bytes:
    if length < 126:
        return bytes((first, length))
    if length < 65536:
        return bytes((first, 126)) + length.to_bytes(2)
    return bytes((first, 127)) + length.to_bytes(8)
