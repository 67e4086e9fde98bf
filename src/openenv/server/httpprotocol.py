"""uvicorn's HTTP protocol (httptools), with a deadline on each request's headers.

uvicorn times out an idle keep-alive connection, but not one that never
finishes its request: a TCP connect that sends nothing, or an upgrade request
sent half, is held until the client leaves. Hundreds of them cost a file
descriptor and a protocol object each, indefinitely. Here a connection must
complete each request's headers (a WebSocket upgrade included) within
``header_timeout`` seconds of connecting, or of the request's first byte;
otherwise it is closed. A request body, a response, and the WebSocket session
after the upgrade are not bounded by it.

The deadline is ``OPENENV_HEADER_TIMEOUT`` (default 10 s). ``openenv serve``
and ``openenv.testing.run_server`` use this protocol; with plain uvicorn, pass
``--http openenv.server.httpprotocol:HttpToolsProtocol``.
"""

from __future__ import annotations

import asyncio
import logging
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _UvicornHttpTools

__all__ = ["HEADER_TIMEOUT", "HttpToolsProtocol"]

HEADER_TIMEOUT = float(os.environ.get("OPENENV_HEADER_TIMEOUT", "10"))

logger = logging.getLogger("openenv.server")


class HttpToolsProtocol(_UvicornHttpTools):
    """uvicorn's httptools protocol; a request whose headers do not arrive in time is dropped."""

    header_timeout: float = HEADER_TIMEOUT
    _header_deadline: asyncio.TimerHandle | None = None

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
