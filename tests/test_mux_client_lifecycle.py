"""A ``MuxClient``'s end on a real server: dropped without ``close()``, closed by
several coroutines at once, closed while it connects. However it ends, the
server frees every slot its sessions held, and a ``close()`` that has returned
means they are free."""

from __future__ import annotations

import asyncio
import functools
import gc
import warnings
import weakref
from typing import Any

import orjson
import pytest
from servers import Ping, PingEnvironment, Pong, Tracker, health, ping_app, slots_free
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request

from openenv import ConcurrencyConfig, EnvTimeoutError, MuxClient, SessionClosedError, create_app
from openenv.protocol_v2 import SUBPROTOCOL
from openenv.testing import run_server


def client(url: str) -> MuxClient[Ping, Pong, Any]:
    return MuxClient(url, action_cls=Ping, observation_cls=Pong)


async def test_a_client_dropped_without_close_frees_its_sessions_slots() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2)) as url:
        mux = client(url)
        sessions = await mux.open(2)
        assert [r.observation.count for r in await mux.step(sessions, [Ping()] * 2)] == [1, 1]
        dropped = weakref.ref(mux)
        del mux, sessions
        gc.collect()
        assert dropped() is None  # neither its reader nor its sessions keep it alive
        await slots_free(url)
        await tracker.until_closed(2)
        async with client(url) as again:  # the cap's two slots are there to take
            assert len(await again.open(2)) == 2


async def test_a_dropped_client_frees_its_slots_without_waiting_for_the_cycle_collector() -> None:
    # A script that opens a client a round and never closes it, in a process
    # where the collector seldom runs (or is off): each round's slots must be
    # free by the next, or the server's cap fills up.
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2)) as url:
        gc.disable()
        try:
            for _ in range(3):
                mux = client(url)
                sessions = await mux.open(2)  # the whole cap
                assert [r.observation.count for r in await mux.step(sessions, [Ping()] * 2)] == [
                    1,
                    1,
                ]
                dropped = weakref.ref(mux)
                del mux, sessions
                assert dropped() is None  # gone with its last reference
                await slots_free(url)
        finally:
            gc.enable()


async def test_a_session_held_alone_keeps_its_client_alive() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2)) as url:
        (session,) = await client(url).open(1)  # nobody holds the client itself
        gc.collect()
        assert (await session.step(Ping())).observation.count == 1
        assert (await health(url))["active_sessions"] == 1
        await session.mux.close()
        await slots_free(url)


async def test_every_close_returns_only_once_the_sessions_are_closed() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=3)) as url:
        mux = client(url)
        await mux.open(3)
        first = asyncio.ensure_future(mux.close())
        second = asyncio.ensure_future(mux.close())  # while the first is closing
        await second
        assert len(tracker.closed) == 3  # the server closed every environment...
        assert (await health(url))["active_sessions"] == 0  # ...and freed every slot
        await first
        assert mux.closed


async def test_a_closed_client_says_so_to_every_later_call() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=3)) as url:
        mux = client(url)
        sessions = await mux.open(2)
        await sessions[0].close()
        await mux.close()
        calls = [sessions[0].step(Ping()), sessions[1].step(Ping()), mux.open(1)]
        for call in calls:
            with pytest.raises(SessionClosedError, match="this client was closed"):
                await call


async def test_a_close_while_the_client_connects_leaves_nothing_open() -> None:
    handshaking, go_on, left = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def hold_handshake(connection: ServerConnection, request: Request) -> None:
        handshaking.set()
        await go_on.wait()

    async def opens_sessions(ws: ServerConnection) -> None:
        try:
            async for frame in ws:
                opened = [
                    {**r, "type": "opened", "data": {"session_id": f"s{r['session']}"}}
                    for r in orjson.loads(frame)
                ]
                await ws.send(orjson.dumps(opened).decode())
        finally:
            left.set()

    server = serve(
        opens_sessions,
        "127.0.0.1",
        0,
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        process_request=hold_handshake,
    )
    async with server:
        port = next(iter(server.server.sockets)).getsockname()[1]
        mux = client(f"http://127.0.0.1:{port}")
        opening = asyncio.ensure_future(mux.open(2))
        await handshaking.wait()
        await mux.close()  # before the connection is up
        go_on.set()
        with pytest.raises(SessionClosedError, match="this client was closed"):
            await opening  # no session is opened for a closed client
        await asyncio.wait_for(left.wait(), 10)  # and the connection it made is closed
        assert mux.closed


async def test_sessions_opened_before_open_gave_up_are_closed_again() -> None:
    tracker = Tracker()
    two_slots = ConcurrencyConfig(max_concurrent_envs=2, queue_timeout=30)
    app = create_app(functools.partial(PingEnvironment, tracker, None), Ping, Pong, two_slots)
    with run_server(app) as url:
        mux = MuxClient(url, action_cls=Ping, observation_cls=Pong, message_timeout=1)
        # Two open at once; the third waits in line for a slot until open() gives up.
        with pytest.raises(EnvTimeoutError):
            await mux.open(3)
        # None of the three is the caller's to close: the client closes each one
        # (the third once it opens), and the connection stays up meanwhile.
        await tracker.until_created(3)
        await tracker.until_closed(3)
        await slots_free(url)
        assert not mux.closed
        mux.message_timeout = 60
        assert len(await mux.open(2)) == 2
        await mux.close()


def test_a_client_used_after_its_event_loop_ended_says_so_and_closing_frees_the_slots() -> None:
    # A script's pattern: the client made at the top, one asyncio.run to set up,
    # another to train. The connection died with the first loop's reader.
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2)) as url:
        muxes = [MuxClient(url, action_cls=Ping, observation_cls=Pong, message_timeout=10)]

        async def set_up(mux: MuxClient[Ping, Pong, Any]) -> list[Any]:
            sessions = await mux.open(2)
            await mux.reset(sessions)
            return sessions

        sessions = asyncio.run(set_up(muxes[0]))

        async def train(mux: MuxClient[Ping, Pong, Any]) -> None:
            # At once, not after message_timeout.
            with pytest.raises(SessionClosedError, match="event loop that has stopped"):
                await mux.step(sessions, [Ping()] * 2)
            with pytest.raises(SessionClosedError, match="event loop that has stopped"):
                await sessions[0].state()
            await mux.close()  # cuts the connection its loop can no longer close
            assert mux.closed
            assert all(session.closed for session in sessions)
            await slots_free(url)

        asyncio.run(train(muxes[0]))
        # Its socket's file descriptor went with the first loop, which never closed it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            muxes.clear()
            sessions.clear()
            gc.collect()
