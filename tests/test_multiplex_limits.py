"""Protocol v2's limits on a real server: how many requests a frame may carry, how
big it may be, and frames sent as binary. Each refusal is precise, and a refused
frame costs nothing else: the connection goes on, or every slot it held is freed."""

from __future__ import annotations

import orjson
import pytest
from servers import Tracker, ping_app, slots_free
from v2_wire import open_sessions, raw_v2, replies, send, steps_of
from websockets.exceptions import ConnectionClosed

from openenv.testing import run_server


async def test_a_frame_past_the_in_flight_cap_is_refused_and_the_connection_goes_on() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=8, max_requests_in_flight=8)) as url:
        ws = await raw_v2(url)
        try:
            await send(ws, [{"session": k, "type": "open"} for k in range(9)])
            (refused,) = await replies(ws, 1)
            assert "session" not in refused  # the frame's, not a session's
            assert refused["data"]["code"] == "VALIDATION_ERROR"
            assert "at most 8 requests, this one has 9" in refused["data"]["message"]
            assert tracker.created == []  # none of its requests was served
            await open_sessions(ws, 8)  # a frame within the cap is served in full
            await send(ws, steps_of([{"message": str(k)} for k in range(8)]))
            answered = {r["id"]: r["data"]["observation"]["message"] for r in await replies(ws, 8)}
            assert answered == {k: str(k) for k in range(8)}
        finally:
            await ws.close()
        await slots_free(url)
        await tracker.until_closed(8)


async def test_a_frame_over_the_size_limit_closes_1009_and_frees_every_slot() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=4, max_message_size=4096)) as url:
        ws = await raw_v2(url)
        await open_sessions(ws, 4)
        await send(ws, steps_of([{"message": "x" * 2000}] * 4))  # 8 kB in one frame
        with pytest.raises(ConnectionClosed) as closed:
            await replies(ws, 1)  # none comes: the frame is not served in part
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1009
        await slots_free(url)
        await tracker.until_closed(4)


async def test_a_binary_frame_of_json_requests_is_served_as_text_would_be() -> None:
    with run_server(ping_app(Tracker(), max_envs=2)) as url:
        ws = await raw_v2(url)
        try:
            await ws.send(orjson.dumps([{"session": k, "type": "open"} for k in range(2)]))
            assert [r["type"] for r in await replies(ws, 2)] == ["opened", "opened"]
            await ws.send(orjson.dumps(steps_of([{"message": "a"}, {"message": "b"}])))
            answered = {r["id"]: r["data"]["observation"]["message"] for r in await replies(ws, 2)}
            assert answered == {0: "a", 1: "b"}
        finally:
            await ws.close()
        await slots_free(url)
