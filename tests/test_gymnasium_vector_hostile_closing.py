"""RemoteVectorEnv (a session per environment, over v2) against servers that end
or close its sessions badly: a ``closed`` that says no reason, a server that never
answers the close. Each is a precise error, or a close that returns in time."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson
import pytest
from test_gymnasium_vector_hostile import fake_gymnasium_server, serves_until_a_step
from test_mux_client_hostile import CLOSED_WITHOUT_WHY, opened
from websockets.asyncio.server import ServerConnection

from openenv import SessionClosedError
from openenv.adapters.gymnasium import RemoteVectorEnv


@pytest.mark.parametrize("notice", [True, False], ids=["a notice", "a reply"])
@pytest.mark.parametrize("bad", CLOSED_WITHOUT_WHY.values(), ids=CLOSED_WITHOUT_WHY.keys())
async def test_a_closed_that_says_no_reason_is_named_so(notice: bool, bad: dict[str, Any]) -> None:
    async def answer(ws: ServerConnection, requests: list[dict[str, Any]]) -> None:
        first = requests[0]
        closed = {"session": first["session"], "type": "closed", **bad}
        await ws.send(orjson.dumps([closed if notice else {**closed, "id": first["id"]}]).decode())

    async with fake_gymnasium_server(False, serves_until_a_step(False, answer)) as url:
        envs = await asyncio.to_thread(RemoteVectorEnv, url, num_envs=2, timeout=30)
        try:
            await asyncio.to_thread(envs.reset, seed=0)
            with pytest.raises(SessionClosedError, match="the connection failed") as caught:
                await asyncio.to_thread(envs.step, np.array([0, 1]))
            assert "a 'closed' without a message or reason in its data" in str(caught.value)
            assert "'type': 'closed'" in str(caught.value)
        finally:
            await asyncio.to_thread(envs.close)


@pytest.mark.parametrize("frame", ["[1, 2]", '[{"session": 0, "id": 1}, 5]'])
async def test_a_frame_of_items_that_are_not_replies_is_named_so(frame: str) -> None:
    async def answer(ws: ServerConnection, requests: list[dict[str, Any]]) -> None:
        await ws.send(frame)

    async with fake_gymnasium_server(False, serves_until_a_step(False, answer)) as url:
        envs = await asyncio.to_thread(RemoteVectorEnv, url, num_envs=2, timeout=30)
        try:
            await asyncio.to_thread(envs.reset, seed=0)
            with pytest.raises(SessionClosedError, match="not a JSON array of objects") as caught:
                await asyncio.to_thread(envs.step, np.array([0, 1]))
            assert frame in str(caught.value)
        finally:
            await asyncio.to_thread(envs.close)


async def test_closing_against_a_server_that_never_answers_is_bounded_by_connect_timeout() -> None:
    closes_came, hung_up = asyncio.Event(), asyncio.Event()

    async def opens_only(ws: ServerConnection) -> None:
        try:
            async for frame in ws:
                requests = orjson.loads(frame)
                reply = opened(requests)
                if reply is not None:
                    await ws.send(reply)
                elif all(r["type"] == "close" for r in requests):
                    closes_came.set()  # and never answered
        finally:
            hung_up.set()

    async with fake_gymnasium_server(False, opens_only) as url:
        # Calls may wait ten minutes; closing may not.
        envs = await asyncio.to_thread(
            RemoteVectorEnv, url, num_envs=2, timeout=600, connect_timeout=0.5
        )
        # A bound for the test, far below the call timeout: not the behaviour's.
        await asyncio.wait_for(asyncio.to_thread(envs.close), 60)
        assert closes_came.is_set()  # it did ask, and the server never answered
        await asyncio.wait_for(hung_up.wait(), 60)  # and it hung up: the server frees the slots
        with pytest.raises(SessionClosedError, match="closed"):
            envs.step(np.array([0, 1]))
