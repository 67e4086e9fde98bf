"""MCP sessions are cheap to refuse: initialize-and-vanish cannot lock /ws clients out."""

from __future__ import annotations

import asyncio
import contextlib
import functools

import httpx
import pytest
from mcp import Client
from servers import Tracker, health, until
from test_mcp import TrackedCounter, until_active

from counter_env.models import CounterAction, CounterObservation
from openenv import CapacityError, ConcurrencyConfig, RemoteEnv, create_app
from openenv.testing import run_server

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "gone", "version": "0"},
    },
}


def counter(cap: int, **settings: object) -> object:
    TrackedCounter.tracker = Tracker()
    return create_app(
        TrackedCounter,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=cap),  # no session_timeout: 30 min for MCP
        mcp=True,
        **settings,
    )


async def initialize(http: httpx.AsyncClient) -> httpx.Response:
    """A bare initialize whose client never comes back."""
    return await http.post(
        "/mcp", json=INITIALIZE, headers={"accept": "application/json, text/event-stream"}
    )


async def test_sessions_without_a_tool_call_are_closed_after_the_open_timeout() -> None:
    app = counter(4, mcp_open_timeout=2, mcp_sessions_per_client=4)
    with run_server(app) as url:
        async with Client(f"{url}/mcp") as working, httpx.AsyncClient(base_url=url) as http:
            await working.call_tool("increment", {"amount": 2})
            bare = [await initialize(http) for _ in range(3)]
            assert [r.status_code for r in bare] == [200, 200, 200]
            # Every slot is taken now, but the three that never called a tool
            # are closed within mcp_open_timeout, not the 30-minute idle timeout.
            await TrackedCounter.tracker.until_closed(3)
            await until_active(url, 1)
            async with RemoteEnv(url, capacity_timeout=0).session() as session:
                assert (await session.call_tool("increment", amount=1)).data == {"value": 1}
            # The MCP SDK's side of those sessions is gone too, not left to its 30 minutes.
            gone = await http.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                headers={
                    "accept": "application/json, text/event-stream",
                    "mcp-session-id": bare[0].headers["mcp-session-id"],
                    "mcp-protocol-version": "2025-06-18",
                },
            )
            assert gone.status_code == 404
            # The session that did call a tool is still there.
            value = await working.call_tool("get_value", {})
            assert value.structured_content["data"] == 2  # type: ignore[index]


async def test_one_address_cannot_take_every_slot() -> None:
    with run_server(counter(4)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            opened = [await initialize(http) for _ in range(2)]
            assert [r.status_code for r in opened] == [200, 200]
            refused = await initialize(http)
            assert refused.status_code == 429
            assert "already holds 2 MCP sessions" in refused.json()["error"]["message"]
            assert len(TrackedCounter.tracker.created) == 2
            # Half the cap is left for everyone else.
            env = RemoteEnv(url, capacity_timeout=0)
            async with env.session(), env.session():
                with pytest.raises(CapacityError):
                    await env.session().open()
            # Ending a session lets the address open another.
            sid = opened[0].headers["mcp-session-id"]
            ended = await http.delete(
                "/mcp", headers={"mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
            )
            assert ended.status_code == 200
            assert (await initialize(http)).status_code == 200
            # Another address has a limit of its own (any 127.x.y.z reaches loopback).
            other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient(base_url=url, transport=other) as elsewhere:
                assert (await initialize(elsewhere)).status_code == 200
                assert (await initialize(elsewhere)).status_code == 200
            await until_active(url, 4)


ACCEPT = {"accept": "application/json, text/event-stream"}


async def test_a_body_over_max_message_size_gets_413_and_opens_nothing() -> None:
    with run_server(counter(4, max_message_size=64 * 1024)) as url:
        padded = {**INITIALIZE, "params": {**INITIALIZE["params"], "padding": "x" * 100_000}}
        async with httpx.AsyncClient(base_url=url) as http:
            refused = await http.post("/mcp", json=padded, headers=ACCEPT)
            assert refused.status_code == 413
            error = refused.json()["error"]
            assert "over 65536 bytes (max_message_size)" in error["message"]
            assert TrackedCounter.tracker.created == []
        # Within the limit, MCP goes on as before.
        async with Client(f"{url}/mcp") as mcp:
            done = await mcp.call_tool("increment", {"amount": 3})
            assert done.structured_content["data"] == {"value": 3}  # type: ignore[index]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_that_never_ends_is_refused_without_reading_it_all(framing: str) -> None:
    """A client that announces a gigabyte, or streams chunks for ever, gets its
    413 once it is past the limit; the server does not wait for (or keep) the rest."""
    limit = 64 * 1024
    with run_server(counter(4, max_message_size=limit)) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        framed = (
            "content-length: 1000000000"
            if framing == "content-length"
            else ("transfer-encoding: chunked")
        )
        writer.write(
            f"POST /mcp HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"accept: application/json, text/event-stream\r\n{framed}\r\n\r\n".encode()
        )
        piece = b"x" * 16384
        if framing == "chunked":
            piece = b"%x\r\n%s\r\n" % (len(piece), piece)
        status = asyncio.ensure_future(reader.readline())
        sent = 0
        with contextlib.suppress(ConnectionError):  # the server may close once it answered
            while not status.done():
                # Far more than the limit, far less than the gigabyte announced.
                assert sent < 400 * limit, "the server read on past max_message_size"
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
                await asyncio.sleep(0)  # lets the reply, if it came, be read
        assert (await status).startswith(b"HTTP/1.1 413 ")
        writer.close()
        assert TrackedCounter.tracker.created == []
        async with Client(f"{url}/mcp") as mcp:  # and the server goes on
            assert (await mcp.list_tools()).tools[0].name == "increment"


@pytest.mark.parametrize(
    "body",
    [b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}', b"not json", b"[]", b""],
    ids=["not-initialize", "not-json", "a-list", "empty"],
)
async def test_a_request_that_is_no_initialize_makes_no_environment(body: bytes) -> None:
    """Without a session id only an initialize may open a session: anything else is
    refused by the MCP SDK as before, and never costs an environment first."""
    with run_server(counter(4)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            headers = {**ACCEPT, "content-type": "application/json"}
            refused = await http.post("/mcp", content=body, headers=headers)
            assert refused.status_code == 400
            assert TrackedCounter.tracker.created == []
            assert (await initialize(http)).status_code == 200
            assert len(TrackedCounter.tracker.created) == 1


async def test_an_initialize_that_leaves_while_queued_leaves_the_line_at_once() -> None:
    """An MCP initialize waits in the same line for a slot as ``/ws`` and HTTP
    callers; one whose client left kept its place until the slot freed, then had
    an environment made (and reset) for it, held until ``mcp_open_timeout``."""
    TrackedCounter.tracker = Tracker()
    concurrency = ConcurrencyConfig(max_concurrent_envs=1, queue_timeout=30)
    app = create_app(TrackedCounter, CounterAction, CounterObservation, concurrency, mcp=True)
    with run_server(app) as url:
        async with RemoteEnv(url).session() as holder, httpx.AsyncClient(base_url=url) as http:
            await holder.call_tool("increment", amount=1)  # the one slot
            waiting = asyncio.create_task(initialize(http))

            async def queued(count: int) -> bool:
                return (await health(url))["queued_sessions"] == count

            await until(functools.partial(queued, 1), what="the initialize in line")
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            # At once, while the slot it waited for is still taken.
            await until(functools.partial(queued, 0), what="the caller that left out of line")
        await until_active(url, 0)
        assert len(TrackedCounter.tracker.created) == 1  # the holder's only
        async with Client(f"{url}/mcp") as mcp:  # and the slot is there for the next
            done = await mcp.call_tool("increment", {"amount": 3})
            assert done.structured_content["data"] == {"value": 3}  # type: ignore[index]
