"""A v2 connection spoken by hand, for tests that write frames the clients never would."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from openenv.client import ws_url
from openenv.protocol_v2 import SUBPROTOCOL


async def raw_v2(url: str) -> ClientConnection:
    return await connect(ws_url(url), subprotocols=[SUBPROTOCOL])  # type: ignore[list-item]


async def send(ws: ClientConnection, items: Any) -> None:
    await ws.send(items if isinstance(items, str) else orjson.dumps(items).decode())


async def replies(ws: ClientConnection, count: int) -> list[dict[str, Any]]:
    """The next ``count`` replies, however the server split them into frames."""
    got: list[dict[str, Any]] = []
    while len(got) < count:
        frame = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
        assert isinstance(frame, list), frame
        got.extend(frame)
    assert len(got) == count, got
    return got


async def open_sessions(ws: ClientConnection, count: int) -> None:
    """Open sessions 0 to ``count - 1`` and read their replies."""
    await send(ws, [{"session": k, "type": "open"} for k in range(count)])
    await replies(ws, count)


def steps_of(datas: list[Any]) -> list[dict[str, Any]]:
    """One step per session, session ``k`` with ``datas[k]`` and request id ``k``."""
    return [{"session": k, "type": "step", "data": data, "id": k} for k, data in enumerate(datas)]
