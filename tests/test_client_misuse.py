"""Clients used the ways training code ends up using them: calls racing to open
the connection, blocking calls from inside the loop that owns it, a Ctrl-C in
the middle of a blocking call, batches of no sessions. Each either works or
says what is wrong; none splits a session, hangs, or leaves a slot held."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from servers import Ping, PingEnvironment, Pong, Tracker, ping_app, slots_free

from openenv import (
    ConcurrencyConfig,
    MuxClient,
    RemoteEnv,
    ServerPool,
    WebSocketEnvClient,
    create_app,
)
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


async def test_a_blocking_call_inside_the_loop_that_owns_the_connection_says_so() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2)) as url:
        client = ping_client(url)
        await client.reset()  # the connection lives on this test's loop
        # This loop is blocked while it waits: carrying the call here would wait for ever.
        with pytest.raises(RuntimeError, match="await the client's methods"):
            client.sync().step(Ping())
        # The client goes on, awaited as it should be.
        assert (await client.step(Ping())).observation.count == 1
        await client.close()
        await slots_free(url)


def _ctrl_c_once_queued(url: str) -> threading.Thread:
    """A thread that sends SIGINT (Ctrl-C) to the main thread once the server
    has a connection waiting in line for a slot."""

    def watch() -> None:
        with httpx.Client(base_url=url) as http:
            while http.get("/health").json()["queued_sessions"] != 1:
                threading.Event().wait(0.01)  # a poll's interval
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_while_a_sync_session_waits_for_a_slot_leaves_no_session() -> None:
    one_slot = ConcurrencyConfig(max_concurrent_envs=1, queue_timeout=30)
    with run_server(create_app(PingEnvironment, Ping, Pong, one_slot)) as url:
        holder = ping_client(url).sync()
        holder.reset()  # holds the one slot
        env = RemoteEnv(url, action_cls=Ping, observation_cls=Pong).sync()
        watcher = _ctrl_c_once_queued(url)
        with pytest.raises(KeyboardInterrupt):
            env.session(seed=1).open()  # in line for the slot, until Ctrl-C
        watcher.join()
        holder.close()
        # The interrupted opening is abandoned, not left to take the slot when
        # it frees, for a session nobody can reach or close.
        asyncio.run(slots_free(url))


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


async def test_a_negative_number_of_sessions_is_refused_by_name() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=1)) as url:
        async with MuxClient(url, action_cls=Ping, observation_cls=Pong) as mux:
            # It was an empty batch, as if a loop's arithmetic had gone right.
            with pytest.raises(ValueError, match=r"n \(the number of sessions to open\).* -1"):
                await mux.open(-1)
            with pytest.raises(TypeError):
                await mux.open(1.5)  # type: ignore[arg-type]
            (env,) = await mux.open(1)  # the client goes on
            assert (await mux.step([env], [Ping()]))[0].observation.count == 1
        await slots_free(url)


def test_clients_dropped_unclosed_free_their_sessions_when_collected() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=8)) as url:
        for _ in range(5):  # one client per episode, never closed
            env = ping_client(url).sync()
            env.reset()
            env.step(Ping())

        async def episode() -> None:
            client = ping_client(url)
            await client.reset()

        asyncio.run(episode())  # dropped inside a loop that then ends
        del env
        gc.collect()
        # Their keepalives held all six sessions open for as long as the process
        # lived; collected, each connection is closed and its slot freed.
        tracker.wait_closed(6)
        asyncio.run(slots_free(url))


async def test_a_batch_with_another_clients_session_is_refused_before_anything_is_sent() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=4)) as url:
        async with (
            MuxClient(url, action_cls=Ping, observation_cls=Pong) as a,
            MuxClient(url, action_cls=Ping, observation_cls=Pong) as b,
        ):
            (mine,) = await a.open(1)
            (theirs,) = await b.open(1)
            # Both are session 0 of their connection: sent on a's, b's step would step a's.
            with pytest.raises(ValueError, match="another MuxClient"):
                await a.step([mine, theirs], [Ping(), Ping()])
            with pytest.raises(ValueError, match="another MuxClient"):
                await a.close_sessions([theirs])
            assert (await mine.state()).step_count == 0
            assert not theirs.closed
            assert [r.observation.count for r in await b.step([theirs], [Ping()])] == [1]
        await slots_free(url)


async def test_a_batch_reset_takes_numpy_integer_seeds() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2)) as url:
        async with MuxClient(url, action_cls=Ping, observation_cls=Pong) as mux:
            envs = await mux.open(2)
            rng = np.random.default_rng(0)
            seed = rng.integers(100, 200)  # a numpy integer, one for all
            results = await mux.reset(envs, seed=seed)
            assert [r.observation.message for r in results] == [f"reset:{seed}"] * 2
            results = await mux.reset(envs, seed=np.arange(2))
            assert [r.observation.message for r in results] == ["reset:0", "reset:1"]
            with pytest.raises(TypeError):
                await mux.reset(envs, seed=1.5)  # type: ignore[arg-type]
        await slots_free(url)


SECRET = "sesame-sesame-sesame"


@pytest.mark.parametrize("key", [f"{SECRET}\n", f"{SECRET}\r\nX-Injected: 1", f"{SECRET}é"])
def test_an_api_key_no_header_can_carry_is_refused_without_being_shown(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A key read from a file keeps its line break: sent, the HTTP libraries'
    # errors printed it whole, into the training log.
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=2, api_key=SECRET)) as url:

        async def mux_open() -> None:
            async with MuxClient(url, action_cls=Ping, observation_cls=Pong, api_key=key) as mux:
                await mux.open(1)

        uses: list[Callable[[], object]] = [
            lambda: ping_client(url, api_key=key).reset(),
            lambda: asyncio.run(mux_open()),
            lambda: RemoteEnv(url, api_key=key).sync().list_tools(),
        ]
        for use in uses:
            with pytest.raises(ValueError, match="API key has a character") as raised:
                use()
            assert SECRET not in str(raised.value)
        monkeypatch.setenv("OPENENV_API_KEY", key)
        with pytest.raises(ValueError, match=r"\$OPENENV_API_KEY has a character") as raised:
            ping_client(url).reset()
        assert SECRET not in str(raised.value)
        monkeypatch.setenv("OPENENV_API_KEY", SECRET)
        env = ping_client(url)
        assert env.reset().observation.message == "reset:None"
        env.close()
        asyncio.run(slots_free(url))


@pytest.mark.parametrize(
    "pool",
    [
        "http://127.0.0.1:1,http://127.0.0.1:2",
        ServerPool(["http://127.0.0.1:1", "http://127.0.0.1:2"]),
    ],
    ids=["URLs joined by commas", "ServerPool"],
)
def test_a_pool_given_to_a_mux_client_is_refused_saying_why(pool: str | ServerPool) -> None:
    # scaling.md: a pool works wherever a URL does, but for MuxClient, which
    # refuses it up front (a ServerPool object was a bare "not iterable").
    with pytest.raises(ValueError, match="MuxClient holds one connection to one server"):
        MuxClient(pool)  # type: ignore[arg-type]
