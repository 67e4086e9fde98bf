"""A ``MuxClient``'s end on a real server: dropped without ``close()``, closed by
several coroutines at once, closed while it connects. However it ends, the
server frees every slot its sessions held, and a ``close()`` that has returned
means they are free."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from servers import Ping, Pong, Tracker, ping_app, slots_free

from openenv import MuxClient
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
