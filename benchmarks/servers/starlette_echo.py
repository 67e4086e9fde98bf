"""The floor on our own stack: a bare Starlette WebSocket route that answers like echo_env.

No sessions, no validation, no environment: parse the frame, build the same
observation reply, send it. ``BENCH_JSON=orjson`` swaps the stdlib ``json``
module for orjson; the event loop is uvicorn's ``--loop`` choice.
"""

import json
import os
from collections.abc import Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

loads: Callable[[str], Any]
dumps: Callable[[Any], str]
if os.environ.get("BENCH_JSON") == "orjson":
    loads = orjson.loads

    def dumps(obj: Any) -> str:
        return orjson.dumps(obj).decode()
else:
    loads, dumps = json.loads, json.dumps


def reply(message: dict[str, Any]) -> dict[str, Any]:
    """The observation frame echo_env would send for this request."""
    text = message.get("data", {}).get("message", "") if message.get("type") == "step" else ""
    return {
        "type": "observation",
        "data": {
            "observation": {"echoed_message": text, "message_length": len(text)},
            "reward": len(text) / 10,
            "done": False,
        },
    }


async def ws(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.send_text(dumps(reply(loads(await websocket.receive_text()))))
    except WebSocketDisconnect:
        pass


async def health(request: object) -> JSONResponse:
    return JSONResponse({"status": "healthy"})


app = Starlette(routes=[Route("/health", health), WebSocketRoute("/ws", ws)])
