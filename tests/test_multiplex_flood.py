"""A v2 client that sends far more requests than ``max_requests_in_flight`` and reads
no reply: the server stops reading its connection rather than buffer replies for
it without bound, serves other connections meanwhile, and answers every request
exactly once when the client reads again."""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families
from servers import Ping, PingEnvironment, Pong, until
from v2_wire import open_sessions, send
from websockets.asyncio.client import ClientConnection, connect

from openenv import ConcurrencyConfig, MuxClient, create_app
from openenv.client import ws_url
from openenv.protocol_v2 import SUBPROTOCOL
from openenv.testing import run_server

CAP = 4  # max_requests_in_flight
REPLY = 256 * 1024  # bytes of each observation: a few fill the socket buffers


class Produced:
    """Replies made by the environment against replies read by the client."""

    def __init__(self) -> None:
        self.started = 0
        self.read = 0
        self.most_unread = 0  # the most replies made and not yet read, at any time
        self._lock = threading.Lock()

    def step(self) -> None:
        with self._lock:
            self.started += 1
            self.most_unread = max(self.most_unread, self.started - self.read)


class Large(PingEnvironment):
    def __init__(self, produced: Produced) -> None:
        super().__init__()
        self.produced = produced

    def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        self.produced.step()
        return Pong(message="x" * REPLY, count=1)


async def paused_connections(url: str) -> float:
    """The server's gauge of v2 connections it stopped reading (``/metrics``)."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name.endswith("_paused")]
    return float(family.samples[0].value)


def buffered_bytes(sock: socket.socket) -> int:
    """What the kernels may hold of replies the client has not read: the server's
    send buffer (autotuned up to tcp_wmem's maximum) and the client's receive buffer."""
    with open("/proc/sys/net/ipv4/tcp_wmem") as wmem:
        send_max = int(wmem.read().split()[2])
    return send_max + sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


async def slow_reader(url: str) -> tuple[socket.socket, ClientConnection]:
    """A v2 connection whose socket buffers as little as the kernel allows, and
    whose client queues one frame: what it does not read backs up at once."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # no autotuning
    sock.connect((host, int(port)))
    ws = await connect(
        ws_url(url),
        sock=sock,
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        max_size=None,
        max_queue=1,
        compression=None,  # the replies are all "x": deflated, no buffer would fill
    )
    return sock, ws


async def test_a_client_that_floods_and_reads_nothing_makes_the_server_stop_reading() -> None:
    produced = Produced()
    app = create_app(
        functools.partial(Large, produced),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=2),
        max_requests_in_flight=CAP,
    )
    with run_server(app) as url:
        sock, ws = await slow_reader(url)
        try:
            await open_sessions(ws, 1)
            # Made and not read, at most: what the kernels hold, a frame in the
            # server's transport and one in the client's queue (each of up to CAP
            # replies), and CAP more in the server, in flight or waiting to go out.
            bound = buffered_bytes(sock) // REPLY + 4 * CAP + 2
            total = 3 * bound
            for k in range(total):  # one request a frame, none read
                await send(ws, [{"session": 0, "type": "step", "data": {}, "id": k}])

            async def stopped_or_past_the_bound() -> bool:
                return produced.started > bound or await paused_connections(url) == 1

            await until(stopped_or_past_the_bound, 30, "the server to stop reading")
            assert produced.started <= bound

            # Other connections are served meanwhile.
            async with MuxClient(url, action_cls=Ping, observation_cls=Pong) as other:
                (session,) = await other.open(1)
                assert (await session.step(Ping())).observation.count == 1

            answered: list[int] = []
            while len(answered) < total:
                frame = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
                produced.read += len(frame)
                answered.extend(r["id"] for r in frame if r["type"] == "observation")
            assert sorted(answered) == list(range(total))  # each exactly once
            assert produced.most_unread <= bound
            assert await paused_connections(url) == 0  # read again, and nothing left
        finally:
            await ws.close()


async def test_a_client_that_reads_nothing_shows_in_the_paused_gauge_under_the_default_cap() -> (
    None
):
    # With the default max_requests_in_flight (4096), the reader never runs out
    # of room first: the transport stops reading once replies back up, and that
    # connection must show in the gauge just the same.
    produced = Produced()
    app = create_app(
        functools.partial(Large, produced), Ping, Pong, ConcurrencyConfig(max_concurrent_envs=2)
    )
    with run_server(app) as url:
        sock, ws = await slow_reader(url)
        try:
            await open_sessions(ws, 1)
            total = buffered_bytes(sock) // REPLY + 16  # more than the kernels can hold
            for k in range(total):
                await send(ws, [{"session": 0, "type": "step", "data": {}, "id": k}])

            async def shown() -> bool:
                return await paused_connections(url) == 1

            await until(shown, 30, "the connection in the paused gauge")
            answered = 0
            while answered < total:
                frame = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
                answered += sum(1 for r in frame if r["type"] == "observation")

            async def cleared() -> bool:
                return await paused_connections(url) == 0

            await until(cleared, 30, "the gauge back to 0 once the client reads")
        finally:
            await ws.close()


class Huge(PingEnvironment):
    """One reply larger than every buffer between the server and a client."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        return Pong(message="x" * self.size, count=1)


async def test_one_reply_that_backs_up_shows_in_the_paused_gauge() -> None:
    # The one reply goes to the transport at once (the socket was writable), and
    # nothing else is asked: only the transport's full buffer says the connection
    # is not read, and the gauge must say so too.
    size = 16 * 2**20
    app = create_app(functools.partial(Huge, size), Ping, Pong)
    with run_server(app) as url:
        sock, ws = await slow_reader(url)
        try:
            assert buffered_bytes(sock) < size // 2
            await open_sessions(ws, 1)
            await send(ws, [{"session": 0, "type": "step", "data": {}, "id": 1}])

            async def shown() -> bool:
                return await paused_connections(url) == 1

            await until(shown, 30, "the connection in the paused gauge")
            (reply,) = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
            assert (reply["id"], len(reply["data"]["observation"]["message"])) == (1, size)

            async def cleared() -> bool:
                return await paused_connections(url) == 0

            await until(cleared, 30, "the gauge back to 0 once the client reads")
        finally:
            await ws.close()
