"""The floor without ASGI: a bare ``websockets`` server that answers like echo_env.

Run as ``python -m servers.websockets_echo --port N`` (asyncio event loop,
stdlib ``json``); ``GET /health`` answers 200 so the harness can wait for it.
"""

import argparse
import asyncio
import contextlib
import json
from http import HTTPStatus

from websockets.asyncio.server import Request, Response, ServerConnection, serve

from servers.starlette_echo import reply


async def echo(websocket: ServerConnection) -> None:
    async for frame in websocket:
        await websocket.send(json.dumps(reply(json.loads(frame))))


def health(connection: ServerConnection, request: Request) -> Response | None:
    if request.path == "/health":
        return connection.respond(HTTPStatus.OK, "healthy\n")
    return None


async def main(port: int) -> None:
    async with serve(
        echo, "127.0.0.1", port, process_request=health, compression=None, backlog=4096
    ) as server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parser.parse_args().port))
