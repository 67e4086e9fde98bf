"""A loopback TCP proxy whose connections a test can cut, like a network drop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target``; ``cut()`` resets every open connection.

    Use as a context manager; ``url`` is the proxy's ``http://`` base URL,
    ``accepted`` counts the connections it took, ``retarget(url)`` sends
    the next ones elsewhere (a server that came back on another port), and
    ``stop_reading()`` makes the server look hung: nothing clients send is
    taken any more, so once the buffers are full their writes wait.
    """

    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        assert parts.hostname is not None
        assert parts.port is not None
        self._target = (parts.hostname, parts.port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy")
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.BaseTransport] = set()
        self._clients: set[asyncio.BaseTransport] = set()  # the clients' side of each pair
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading = threading.Event()
        self._reading.set()
        self.url = ""
        self.accepted = 0

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        self._server = self._call(self._start())
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def retarget(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        assert parts.hostname is not None
        assert parts.port is not None
        self._target = (parts.hostname, parts.port)

    def stop_reading(self) -> None:
        """Take nothing more from the clients (what the server sends still flows)."""
        self._reading.clear()
        self._call(self._pause_clients())

    def cut(self) -> int:
        """Reset every connection open now (both sides see an abrupt close); keep listening."""
        return self._call(self._cut())

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer.transport, up_writer.transport)
        self._transports.update(pair)
        self._clients.add(writer.transport)
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, self._reading),
                self._pipe(up_reader, writer),
                return_exceptions=True,
            )
        finally:
            for transport in pair:
                transport.abort()
                self._transports.discard(transport)
            self._clients.discard(writer.transport)
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        reading: threading.Event | None = None,
    ) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if reading is not None and not reading.is_set():
                    await asyncio.Event().wait()  # stopped for good: until cut or closed
                writer.write(data)
                await writer.drain()
        finally:
            # Either side finishing ends the pair: HTTP/1.1 and WebSocket need no half-close.
            writer.transport.abort()

    async def _pause_clients(self) -> None:
        # Not even into the kernel's buffer: as if the server's process were stopped.
        for transport in self._clients:
            assert isinstance(transport, asyncio.ReadTransport)
            transport.pause_reading()

    async def _cut(self) -> int:
        transports = list(self._transports)
        for transport in transports:
            transport.abort()
        return len(transports) // 2

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._cut()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
