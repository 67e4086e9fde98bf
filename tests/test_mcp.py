"""The official MCP client against /mcp: tools listed and called, one environment per session."""

from __future__ import annotations

import asyncio

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from servers import Tracker
from tool_envs import HTTP

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.app import app as counter_app
from counter_env.server.environment import CounterEnvironment
from openenv import CapacityError, ConcurrencyConfig, RemoteEnv, create_app
from openenv.testing import run_server
from openenv.tools import tools_of


class TrackedCounter(CounterEnvironment):
    """Counts instances created and closed, to see slots come back."""

    tracker = Tracker()

    def __init__(self) -> None:
        super().__init__()
        self.tracker.on_create(self)

    def close(self) -> None:
        self.tracker.on_close(self)


def counter_with_cap(cap: int, session_timeout: float | None = None) -> object:
    TrackedCounter.tracker = Tracker()
    return create_app(
        TrackedCounter,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=cap, session_timeout=session_timeout),
        mcp=True,
    )


def active_sessions(url: str) -> int:
    count: int = HTTP.get(f"{url}/health").json()["active_sessions"]
    return count


async def until_active(url: str, count: int, wait: float = 10.0) -> None:
    """Poll /health until ``count`` sessions are open (slots free just after close())."""
    deadline = asyncio.get_running_loop().time() + wait
    while (active := await asyncio.to_thread(active_sessions, url)) != count:
        assert asyncio.get_running_loop().time() < deadline, f"{active} sessions, not {count}"


async def test_the_mcp_client_lists_and_calls_the_counter_tools() -> None:
    with run_server(counter_app) as url:
        async with Client(f"{url}/mcp") as mcp:
            listed = (await mcp.list_tools()).tools
            assert [t.name for t in listed] == ["increment", "get_value", "submit"]
            expected = tools_of(CounterEnvironment)["increment"].info
            assert listed[0].description == expected.description
            assert listed[0].input_schema == expected.input_schema
            assert listed[0].input_schema["required"] == ["amount"]

            result = await mcp.call_tool("increment", {"amount": 3})
            assert not result.is_error
            assert result.content[0].text == '{"value":3}'  # type: ignore[union-attr]
            assert result.structured_content == {
                "reward": None,
                "finished": False,
                "data": {"value": 3},
            }
            value = await mcp.call_tool("get_value", {})
            assert value.structured_content["data"] == 3  # type: ignore[index]
            # reset() without a task: the first training task; its target is 4
            submitted = await mcp.call_tool("submit", {})
            assert submitted.content[0].text == "wrong: the counter is 3, the target was 4"  # type: ignore[union-attr]
            assert submitted.structured_content == {"reward": 0.0, "finished": True}
            again = await mcp.call_tool("increment", {"amount": 1})
            assert again.is_error
            assert "[EPISODE_FINISHED]" in again.content[0].text  # type: ignore[union-attr]
            assert active_sessions(url) == 1
        assert active_sessions(url) == 0


async def test_two_mcp_sessions_keep_separate_counters() -> None:
    with run_server(counter_with_cap(4)) as url:
        async with Client(f"{url}/mcp") as a, Client(f"{url}/mcp") as b:
            await a.call_tool("increment", {"amount": 2})
            await b.call_tool("increment", {"amount": 10})
            await a.call_tool("increment", {"amount": 2})
            values = await asyncio.gather(
                a.call_tool("get_value", {}), b.call_tool("get_value", {})
            )
            assert [v.structured_content["data"] for v in values] == [4, 10]  # type: ignore[index]
            assert active_sessions(url) == 2
        await TrackedCounter.tracker.until_closed(2)
        assert len(TrackedCounter.tracker.created) == 2
        await until_active(url, 0)


async def test_bad_tool_calls_keep_the_mcp_session_usable() -> None:
    with run_server(counter_with_cap(1)) as url:
        async with Client(f"{url}/mcp") as mcp:
            with pytest.raises(MCPError, match=r"'incremnt'.*did you mean 'increment'"):
                await mcp.call_tool("incremnt", {"amount": 1})
            bad = await mcp.call_tool("increment", {"amount": "many"})
            assert bad.is_error
            assert bad.content[0].text.startswith(  # type: ignore[union-attr]
                "[VALIDATION_ERROR] invalid arguments for tool 'increment': amount:"
            )
            ok = await mcp.call_tool("increment", {"amount": 1})
            assert ok.structured_content["data"] == {"value": 1}  # type: ignore[index]


async def test_mcp_and_websocket_sessions_share_one_cap() -> None:
    with run_server(counter_with_cap(1)) as url:
        env = RemoteEnv(url, capacity_timeout=0)
        async with Client(f"{url}/mcp"):
            with pytest.raises(CapacityError):
                await env.session().open()
        # the MCP session ended: its slot is free again
        await TrackedCounter.tracker.until_closed(1)
        async with env.session() as session:
            assert (await session.call_tool("increment", amount=1)).data == {"value": 1}
            with pytest.raises(BaseExceptionGroup) as refused:
                async with Client(f"{url}/mcp"):
                    pass
            assert refused.group_contains(
                MCPError, match=r"server at capacity \(1 sessions\); retry later", depth=None
            )
    # the refused MCP client never got an environment
    assert len(TrackedCounter.tracker.created) == 2


async def test_a_vanished_mcp_client_is_found_by_idling_and_its_slot_freed() -> None:
    with run_server(counter_with_cap(1, session_timeout=0.2)) as url:
        # Open a session with a bare initialize, then never come back.
        opened = HTTP.post(
            f"{url}/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "gone", "version": "0"},
                },
            },
            headers={"accept": "application/json, text/event-stream"},
        )
        assert opened.status_code == 200
        assert opened.headers["mcp-session-id"]
        assert len(TrackedCounter.tracker.created) == 1
        await TrackedCounter.tracker.until_closed(1)
        await until_active(url, 0)


async def test_a_sessionless_client_gets_a_clear_error() -> None:
    with run_server(counter_app) as url:
        async with Client(f"{url}/mcp", mode="2026-07-28") as mcp:
            with pytest.raises(MCPError, match="each MCP session owns one"):
                await mcp.call_tool("get_value", {})
        assert active_sessions(url) == 0
