"""uvicorn's HTTP protocol (httptools), with a deadline and a size limit on each request's headers.

uvicorn times out an idle keep-alive connection, but not one that never
finishes its request: a TCP connect that sends nothing, or an upgrade request
sent half, is held until the client leaves. Hundreds of them cost a file
descriptor and a protocol object each, indefinitely. Here a connection must
complete each request's headers (a WebSocket upgrade included) within
``header_timeout`` seconds of connecting, or of the request's first byte;
otherwise it is closed. A request body, a response, and the WebSocket session
after the upgrade are not bounded by it.

Nor does it bound their size: httptools gathers a header value, or the URL,
into one string with a copy for every piece received, so a client that
streams one for ever holds the event loop for seconds (every session waits)
and then memory. Headers past ``OPENENV_MAX_HEADER_BYTES`` (1 MiB, Go's
``net/http`` default) are refused with 431 and the connection closed.

The deadline is ``OPENENV_HEADER_TIMEOUT`` (default 10 s). ``openenv serve``
and ``openenv.testing.run_server`` use this protocol; with plain uvicorn, pass
``--http openenv.server.httpprotocol:HttpToolsProtocol``.
"""

from __future__ import annotations

import asyncio
import logging
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _UvicornHttpTools

__all__ = ["HEADER_TIMEOUT", "MAX_HEADER_BYTES", "HttpToolsProtocol"]


def _positive(name: str, default: float, kind: type[float] | type[int], unit: str) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if not value > 0:  # NaN too
        raise ValueError(f"{name} must be a positive number of {unit}, not {raw!r}")
    return value


HEADER_TIMEOUT = _positive("OPENENV_HEADER_TIMEOUT", 10.0, float, "seconds")
MAX_HEADER_BYTES = int(_positive("OPENENV_MAX_HEADER_BYTES", 1 << 20, int, "bytes"))
LINGER = 5.0  # seconds a refused connection is read (and dropped) before it is closed

logger = logging.getLogger("openenv.server")


class HttpToolsProtocol(_UvicornHttpTools):
    """uvicorn's httptools protocol; a request whose headers do not arrive in time,
    or run past ``max_header_bytes``, is dropped."""

    header_timeout: float = HEADER_TIMEOUT
    max_header_bytes: int = MAX_HEADER_BYTES
    _header_deadline: asyncio.TimerHandle | None = None
    _header_bytes = 0  # received since the headers' deadline was armed
    _refused = False  # answered 431: what else comes is dropped

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped until the client closes, so the 431 reaches it
        super().data_received(data)
        if self._header_deadline is None:  # no request's headers are coming
            return
        # Counted after parsing: a piece that ended one request and began the
        # next counts whole, at most one read (256 KiB) more than the headers.
        self._header_bytes += len(data)
        if self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
            self._refuse_headers()

    def _refuse_headers(self) -> None:
        """Answer 431 and end the connection, reading on for a while first: closing
        with unread bytes makes the kernel reset the connection, and the client
        could lose the answer."""
        self._disarm()
        self._refused = True
        body = f"request headers over {self.max_header_bytes} bytes".encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER, self.transport.close)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        # The first byte of a further request on a kept-alive connection: its
        # headers get a deadline of their own (the first one's is armed already).
        super().on_message_begin()
        if self._header_deadline is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_bytes = 0
        self._header_deadline = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _expire(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A response to an earlier (pipelined) request is still going out:
            # let it finish, then close instead of reading the next request.
            self.cycle.keep_alive = False
            return
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "%s sent no complete request in %gs; closing", self.client, self.header_timeout
            )
        self.transport.close()
