"""A fleet scaling on a real two-node Ray cluster: up under load, down when idle,
and a replica on its way out that gets no new session and keeps one it got."""

from __future__ import annotations

import asyncio
from typing import Any

from fleet_kit import ECHO, healthy, replicas, until

from echo_env.models import EchoAction
from openenv import ServerPool, WebSocketEnvClient
from openenv.fleet import Fleet


def test_the_fleet_grows_under_load_and_shrinks_when_idle(two_nodes: list[str]) -> None:
    fleet = Fleet(
        ECHO,
        replicas=1,
        max_replicas=2,
        num_cpus=0.5,
        max_sessions=4,
        interval=0.3,
        idle_seconds=1.0,
    )
    with fleet as url:
        until(lambda: len(healthy(url)) == 1, "1 healthy replica")

        async def load() -> None:
            clients = [WebSocketEnvClient(ServerPool(url)) for _ in range(4)]
            await asyncio.gather(*(c.reset() for c in clients))  # full: 4 of 4
            try:
                await asyncio.to_thread(until, lambda: len(healthy(url)) == 2, "a 2nd replica")
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        asyncio.run(load())
        # Listed as draining first, then removed.
        until(lambda: len(fleet.where()) == 1, "back to 1 replica when idle")
        assert len(healthy(url)) == 1  # the bound holds: never below min_replicas


def test_the_fleet_adds_one_replica_and_waits_for_it_before_adding_another(
    two_nodes: list[str],
) -> None:
    # One replica full (4 of 4) needs one more, not all four: a replica that is
    # still starting counts as room on the way, so the loop does not add another
    # every interval until the first has come up.
    fleet = Fleet(ECHO, replicas=1, max_replicas=4, num_cpus=0.25, max_sessions=4, interval=0.1)
    with fleet as url:
        until(lambda: len(healthy(url)) == 1, "1 healthy replica")

        async def load() -> None:
            clients = [WebSocketEnvClient(ServerPool(url)) for _ in range(4)]
            await asyncio.gather(*(c.reset() for c in clients))
            try:
                await asyncio.to_thread(until, lambda: len(healthy(url)) == 2, "a 2nd replica")
                # 4 of 8 slots taken is under scale_up_at: two replicas are enough.
                assert len(await asyncio.to_thread(fleet.where)) == 2
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        asyncio.run(load())


def draining(url: str) -> list[dict[str, Any]]:
    return [r for r in replicas(url) if r["status"] == "draining"]


def test_a_replica_on_its_way_out_gets_no_new_session_and_keeps_one_it_got(
    two_nodes: list[str],
) -> None:
    # Scaling down lists the replica as draining before removing it: the
    # directory (and every pool) stops placing sessions there, and a session
    # that reached it anyway (a pool that had not looked again yet) keeps it,
    # where removing it would close that session with 1001 mid-episode.
    fleet = Fleet(
        ECHO,
        replicas=2,
        min_replicas=1,
        num_cpus=0.5,
        max_sessions=4,
        interval=2.0,  # the retirement lasts two intervals: time to act in it
        idle_seconds=3600.0,  # not yet: on a loaded machine one replica may start far later
    )
    with fleet as url:
        until(lambda: len(healthy(url)) == 2, "2 healthy replicas")
        fleet.idle_seconds = 1.0  # both up: now let it scale down
        until(lambda: len(draining(url)) == 1, "a replica listed as draining")
        leaving = draining(url)[0]["url"]

        async def reach_it_anyway() -> None:
            late = WebSocketEnvClient(leaving)  # straight to it, as a stale pool would
            await late.reset()
            try:
                await asyncio.to_thread(until, lambda: len(healthy(url)) == 2, "kept")
                reply = await late.step(EchoAction(message="still here"))
                assert (reply.observation.model_extra or {})["echoed_message"] == "still here"
            finally:
                await late.close()

        asyncio.run(reach_it_anyway())
        assert len(fleet.where()) == 2

        until(lambda: len(draining(url)) == 1, "a replica listed as draining again")

        async def through_the_directory() -> None:
            client = WebSocketEnvClient(url)  # redirected: to the replica that stays
            await client.reset()
            try:
                await asyncio.to_thread(until, lambda: len(fleet.where()) == 1, "the other removed")
                reply = await client.step(EchoAction(message="on the one that stays"))
                extra = reply.observation.model_extra or {}
                assert extra["echoed_message"] == "on the one that stays"
            finally:
                await client.close()

        asyncio.run(through_the_directory())
        assert [r["url"] for r in healthy(url)] != [leaving]
