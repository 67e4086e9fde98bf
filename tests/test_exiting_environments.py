"""Environments whose constructor or ``close()`` calls ``sys.exit()`` (or gets a
``KeyboardInterrupt``): that session fails with a precise error, its slot comes
back, and the server goes on, over /ws, OpenEnv's HTTP calls and MCP alike."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from mcp import Client
from servers import Ping, PingEnvironment, Pong, Tracker, slots_free
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from openenv import ConcurrencyConfig, WebSocketEnvClient, create_app
from openenv.client import ws_url
from openenv.testing import run_server

EXITS = [SystemExit, KeyboardInterrupt]


@pytest.mark.parametrize("exit_type", EXITS)
async def test_a_close_that_exits_frees_its_slot_and_the_server_goes_on(
    exit_type: type[BaseException],
) -> None:
    tracker = Tracker()

    class ExitingClose(PingEnvironment):
        def close(self) -> None:
            super().close()
            raise exit_type(3)

    app = create_app(
        lambda: ExitingClose(tracker),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=1),
        mcp=True,
    )
    with run_server(app) as url:
        # Each transport closes its environment in its own way; before, the
        # first close() stopped the server's event loop, and every session.
        for round_ in range(2):
            async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
                await env.reset()
                assert (await env.step(Ping(message="hi"))).observation.message == "hi"
            await tracker.until_closed(2 * round_ + 1)
            await slots_free(url)
            async with httpx.AsyncClient(base_url=url) as http:
                reply = await http.post("/step", json={"action": {"message": "over http"}})
                assert reply.status_code == 200
                assert reply.json()["observation"]["message"] == "over http"
            await slots_free(url)
        async with Client(f"{url}/mcp") as mcp:
            assert [t.name for t in (await mcp.list_tools()).tools] == []
        await slots_free(url)
        assert len(tracker.created) == len(tracker.closed) == 5


@pytest.mark.parametrize("exit_type", EXITS)
async def test_a_factory_that_exits_is_a_factory_error(exit_type: type[BaseException]) -> None:
    def exiting() -> Any:
        raise exit_type(3)

    with run_server(create_app(exiting, Ping, Pong, mcp=True)) as url:
        for _ in range(2):  # the one slot comes back each time
            async with connect(ws_url(url)) as ws:
                error = orjson.loads(await ws.recv())
                assert error["data"]["code"] == "FACTORY_ERROR"
                assert error["data"]["message"].startswith(
                    f"could not create the environment: {exit_type.__name__}"
                )
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 1011
        async with httpx.AsyncClient(base_url=url) as http:
            reply = await http.post("/reset")
            assert reply.status_code == 500
            assert reply.json()["detail"].startswith(
                f"could not create the environment: {exit_type.__name__}"
            )
            # An MCP initialize makes an environment before the SDK sees it.
            initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
            headers = {"accept": "application/json, text/event-stream"}
            reply = await http.post("/mcp", json=initialize, headers=headers)
            assert reply.status_code == 500
            assert reply.json()["error"]["message"].startswith(
                f"could not create the environment: {exit_type.__name__}"
            )
        await slots_free(url)
