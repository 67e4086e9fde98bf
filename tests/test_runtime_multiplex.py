"""Runners share protocol-v2 connections with a server that speaks it, and fall back when not."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
from runtime_agents import echo_agent, messages
from servers import slots_free
from tcp_proxy import TcpProxy

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, ServerPool, create_app
from openenv.protocol_v2 import SUBPROTOCOL
from openenv.runtime import EpisodeSession, RunConfig, Runners, Task, TaskStatus
from openenv.testing import run_server


class Sockets:
    """ASGI middleware counting the WebSocket connections an app gets, by protocol;
    with ``v1_only`` it hides v2 offers, so the app answers as a v1-only server."""

    def __init__(self, app: Any, *, v1_only: bool = False) -> None:
        self.app = app
        self.v1_only = v1_only
        self.seen: Counter[str] = Counter()
        self.state = app.state  # run_server and the tests reach app.state through it

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            offered = list(scope.get("subprotocols") or ())
            if self.v1_only and SUBPROTOCOL in offered:
                scope = {**scope, "subprotocols": [p for p in offered if p != SUBPROTOCOL]}
            self.seen["v2" if SUBPROTOCOL in (scope.get("subprotocols") or ()) else "v1"] += 1
        await self.app(scope, receive, send)


def echo_app(cap: int = 128) -> Any:
    return create_app(
        EchoEnvironment, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=cap)
    )


def tasks(url: str, count: int) -> list[Task]:
    return [Task(id=f"t{i}", env=url, agent=echo_agent) for i in range(count)]


def check(results: list[Any], count: int) -> None:
    assert [r.status for r in results] == [TaskStatus.OK] * count
    assert [r.value for r in results] == [messages(f"t{i}") for i in range(count)]


def test_runners_drive_many_sessions_over_a_few_connections() -> None:
    app = Sockets(echo_app())
    with run_server(app) as url:
        results = Runners.sync_run_task(tasks(url, 300), RunConfig(max_concurrency=64))
        check(results, 300)
    # 64 sessions in flight fit in one connection; none went over v1.
    assert app.seen == {"v2": 1}


def test_multiplex_false_keeps_one_connection_per_session() -> None:
    app = Sockets(echo_app())
    with run_server(app) as url:
        config = RunConfig(max_concurrency=16, multiplex=False)
        check(Runners.sync_run_task(tasks(url, 40), config), 40)
    assert set(app.seen) == {"v1"}
    assert app.seen["v1"] >= 16


async def test_a_server_that_speaks_only_v1_gets_v1_sessions() -> None:
    app = Sockets(echo_app(), v1_only=True)
    with run_server(app) as url:
        results = await Runners.run_task(tasks(url, 50), RunConfig(max_concurrency=8))
        check(results, 50)
        await slots_free(url)
    # One v2 offer, answered with v1, was remembered: every session went over v1.
    assert app.seen["v2"] == 0
    assert app.seen["v1"] >= 8 + 1


def test_runners_place_v2_sessions_over_a_server_pool_by_free_room() -> None:
    small, large = Sockets(echo_app(cap=3)), Sockets(echo_app(cap=5))
    with run_server(small) as first, run_server(large) as second:
        pool = ServerPool([first, second])
        results = Runners.sync_run_task(
            [Task(id=f"t{i}", env=pool, agent=echo_agent) for i in range(60)],
            RunConfig(max_concurrency=16),  # twice the room there is: sessions wait for it
        )
        check(results, 60)
        assert httpx.get(f"{first}/health").json()["active_sessions"] == 0
        assert httpx.get(f"{second}/health").json()["active_sessions"] == 0
    # Each server got one shared v2 connection and no v1 one.
    assert small.seen == {"v2": 1}
    assert large.seen == {"v2": 1}


async def test_a_connection_cut_mid_run_retries_each_episode_it_held_once() -> None:
    count = 12
    first_attempts: set[str] = set()
    all_in = asyncio.Barrier(count)

    async def cut_mid_episode(session: EpisodeSession) -> list[str]:
        await session.reset()
        task_id = session.task.id
        if task_id not in first_attempts:  # a first attempt: wait for every other one
            first_attempts.add(task_id)
            if await all_in.wait() == 0:  # one of them cuts the connection they share
                assert proxy.cut() == 1
        return await echo_agent(session)

    app = Sockets(echo_app())
    with run_server(app) as url, TcpProxy(url) as proxy:
        config = RunConfig(max_concurrency=count, retry_backoff=0)
        results = await Runners.run_task(
            [Task(id=f"t{i}", env=proxy.url, agent=cut_mid_episode) for i in range(count)], config
        )
        check(results, count)
        # Each episode was cut once, and played again on a new connection.
        assert [r.attempts for r in results] == [2] * count
        await slots_free(url)
    assert app.seen == {"v2": 2}
