"""Clients used the ways training code ends up using them: calls racing to open
the connection, blocking calls from inside the loop that owns it, a Ctrl-C in
the middle of a blocking call, batches of no sessions. Each either works or
says what is wrong; none splits a session, hangs, or leaves a slot held."""

from __future__ import annotations

import asyncio

import pytest
from servers import Ping, Pong, Tracker, ping_app, slots_free

from openenv import MuxClient, WebSocketEnvClient
from openenv.testing import run_server


def ping_client(url: str, **options: object) -> WebSocketEnvClient:
    return WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong, **options)  # type: ignore[arg-type]


async def test_calls_racing_to_open_a_new_client_share_one_session() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=4)) as url:
        client = ping_client(url)
        # No connect first: both calls find no connection.
        reset, state = await asyncio.gather(client.reset(seed=1), client.state())
        assert reset.observation.message == "reset:1"
        assert state.episode_id == "seed-1"  # the state of the session just reset
        steps = await asyncio.gather(*(client.step(Ping()) for _ in range(3)))
        assert sorted(s.observation.count for s in steps) == [1, 2, 3]
        await client.close()
        assert len(tracker.created) == 1
        await slots_free(url)


async def test_a_close_during_the_first_connection_leaves_no_session() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=4)) as url:
        client = ping_client(url)
        first = asyncio.ensure_future(client.reset())
        await asyncio.sleep(0)  # the call's turn: it runs up to its handshake, and waits
        await client.close()
        with pytest.raises(Exception, match="closed"):
            await first
        await slots_free(url)


async def test_a_batch_of_no_sessions_is_an_empty_result() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2)) as url:
        async with MuxClient(url, action_cls=Ping, observation_cls=Pong) as mux:
            envs = await mux.open(2)
            await mux.reset(envs)
            # Every episode done: the batch of those still running is empty.
            running = [e for e in envs if e.closed]
            assert await mux.step(running, []) == []
            assert await mux.reset(running) == []
            assert await mux.open(0) == []
            await mux.close_sessions(running)
            assert [r.observation.count for r in await mux.step(envs, [Ping()] * 2)] == [1, 1]
        await slots_free(url)
