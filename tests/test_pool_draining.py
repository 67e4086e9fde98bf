"""A pool's session that a server turns away as it shuts down goes to another server.

A rolling restart: the server a pool placed a session on begins to drain while
the session waits in its line for a slot. The server refuses it
(``SESSION_ERROR`` with ``draining``); the pool used to hand that to the
caller as a ``SessionError``, where a server gone would have sent it on to
the next one.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from servers import Ping, PingEnvironment, Pong, Tracker, health, until
from test_shutdown import graceful

from openenv import ConcurrencyConfig, EnvClient, ServerPool, create_app
from openenv.runtime import RunConfig, Runners, Task
from openenv.testing import run_server


class PingClient(EnvClient[Ping, Pong, Any]):
    action_cls = Ping
    observation_cls = Pong


def app(tracker: Tracker, max_envs: int) -> Any:
    factory = functools.partial(PingEnvironment, tracker, None)
    return create_app(
        factory, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=max_envs, queue_timeout=60)
    )


async def played_by_client(pool: ServerPool) -> str:
    async with PingClient(pool) as env:
        result = await env.reset()
    return str(result.observation.message)


async def played_by_runners(pool: ServerPool) -> str:
    async def agent(env: Any) -> str:
        return str((await env.reset()).observation.message)

    [result] = await Runners.run_task(Task(input=None, env=pool, agent=agent), RunConfig())
    assert result.success, result.error
    return str(result.answer)


@pytest.mark.parametrize("play", [played_by_client, played_by_runners])
async def test_a_session_turned_away_by_a_draining_server_goes_to_another(
    play: Callable[[ServerPool], Awaitable[str]],
) -> None:
    draining, other = Tracker(), Tracker()
    with graceful(app(draining, 2)) as (url, server), run_server(app(other, 1)) as spare:
        # The pool's view, taken while both have room (and kept: no refresh): the
        # draining server looks the roomier, so the session is placed there.
        pool = ServerPool([url, spare], refresh=3600, wait=30)
        pool.ended(await pool.place())
        holders = [PingClient(url) for _ in range(2)]  # then fill it behind the pool's back
        for holder in holders:
            await holder.reset()
        playing = asyncio.ensure_future(play(pool))

        async def queued() -> bool:
            return (await health(url))["queued_sessions"] == 1

        await until(queued, what="the pool's session in line on the full server")
        server.should_exit = True  # the line is turned away: "server shutting down"
        assert (await playing).startswith("reset:")
        for holder in holders:
            await holder.close()
    assert len(draining.created) == 2  # the holders' only
    assert len(other.created) == 1
