"""Clients in line for a slot that speak compressed WebSocket frames, as browsers
and websockets' own clients do by default (permessage-deflate).

Such a frame is read by websockets, under uvicorn's flow control, which stopped
reading the socket after every message until the app took it: a client that
sent a frame while in line and then left was not seen to leave. It kept its
place (counted in ``queued_sessions``, which pools and fleets subtract from the
room they see) until a slot freed, and got an environment made for it then.
"""

from __future__ import annotations

import asyncio
import functools

from servers import Ping, PingEnvironment, Pong, Tracker, health, slots_free, until
from websockets.asyncio.client import connect

from openenv import ConcurrencyConfig, WebSocketEnvClient, create_app
from openenv.client import ws_url
from openenv.testing import run_server


async def test_compressed_clients_that_leave_while_queued_leave_the_line_at_once() -> None:
    tracker = Tracker()
    factory = functools.partial(PingEnvironment, tracker, None)
    app = create_app(factory, Ping, Pong, ConcurrencyConfig(queue_timeout=60))
    with run_server(app) as url:
        holder = WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong)
        await holder.reset()  # the one slot
        queued = [await connect(ws_url(url), compression="deflate") for _ in range(3)]
        for ws in queued:
            await ws.send('{"type": "reset"}')  # a frame sent while in line

        async def in_line(count: int) -> bool:
            return (await health(url))["queued_sessions"] == count

        await until(functools.partial(in_line, 3), what="three clients in line")
        await queued[0].close()  # a clean close
        queued[1].transport.abort()  # a vanished peer
        await until(functools.partial(in_line, 1), what="the two that left out of line")
        await holder.close()  # the one still in line gets the slot, and plays
        reply = await asyncio.wait_for(queued[2].recv(), 30)
        assert '"type":"observation"' in reply
        await queued[2].close()
        await slots_free(url)
        assert (await health(url))["queued_sessions"] == 0
    assert len(tracker.created) == 2  # the holder's and the last one's
