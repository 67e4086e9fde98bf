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
from test_mux_client_hostile import CLOSED_WITHOUT_WHY
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
