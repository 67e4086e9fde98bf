"""Hostile tools over /mcp and /ws: a tool that exits, overruns or returns what cannot be sent
gets its caller a precise error, ends at most its own session, and leaks no slot."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from servers import Ping, Pong, Tracker, until
from test_mcp import active_sessions, until_active

from openenv import (
    ConcurrencyConfig,
    EnvExecutionError,
    Environment,
    SessionError,
    State,
    ToolOutput,
    WebSocketEnvClient,
    create_app,
    tool,
)
from openenv.server.mcp_bridge import McpBridge
from openenv.server.session_host import SessionState
from openenv.testing import run_server


class Hostile(Environment[Ping, Pong, State]):
    """Tools that misbehave, each in its own way."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    tracker = Tracker()
    release = threading.Event()
    entered = threading.Event()  # a block() call has begun

    def __init__(self) -> None:
        self._state = State()
        self.tracker.on_create(self)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Pong:
        return Pong(message="ready")

    def step(self, action: Ping, **kwargs: Any) -> Pong:
        return Pong(message=action.message)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self.tracker.on_close(self)

    @tool
    def echo(self, x: int) -> int:
        """Give x back."""
        return x

    @tool
    def exit(self) -> str:
        """A plain def that calls sys.exit()."""
        raise SystemExit(3)

    @tool
    async def exit_async(self) -> str:
        """An async def that calls sys.exit()."""
        raise SystemExit(3)

    @tool
    def block(self) -> str:
        """Blocks its thread until the test releases it."""
        self.entered.set()
        self.release.wait(30)
        return "released"

    @tool
    def object_in_metadata(self) -> ToolOutput:
        """A ToolOutput whose metadata is no JSON."""
        return ToolOutput(metadata={"handle": object()})

    @tool
    def lone_surrogate(self) -> str:
        """Text that is no UTF-8."""
        return "\ud800"

    marked = 0

    @tool
    def mark(self) -> int:
        """Count a call that ran."""
        Hostile.marked += 1
        return Hostile.marked

    @tool
    def generator_exit(self) -> str:
        """A plain def that raises GeneratorExit (a BaseException, like SystemExit)."""
        raise GeneratorExit


def hostile_app(cap: int = 4, step_timeout: float | None = None, **settings: Any) -> object:
    Hostile.tracker = Tracker()
    Hostile.release = threading.Event()
    Hostile.entered = threading.Event()
    Hostile.marked = 0
    return create_app(
        Hostile,
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=cap),
        mcp=True,
        step_timeout=step_timeout,
        **settings,
    )


@pytest.mark.parametrize("name", ["exit", "exit_async"])
async def test_a_tool_that_exits_ends_only_its_mcp_session(name: str) -> None:
    with run_server(hostile_app()) as url:
        async with Client(f"{url}/mcp") as other, Client(f"{url}/mcp") as mcp:
            result = await mcp.call_tool(name, {})
            assert result.is_error
            assert result.content[0].text == "[SESSION_ERROR] internal server error"  # type: ignore[union-attr]
            # Its environment is closed and its slot freed; the server serves on.
            await Hostile.tracker.until_closed(1)
            await until_active(url, 1)
            with pytest.raises(MCPError, match="has lost its environment"):
                await mcp.call_tool("echo", {"x": 1})
            assert (await other.call_tool("echo", {"x": 2})).structured_content["data"] == 2  # type: ignore[index]
        await until_active(url, 0)


async def test_a_blocking_tool_past_its_deadline_ends_its_mcp_session() -> None:
    with run_server(hostile_app(step_timeout=0.2)) as url:
        async with Client(f"{url}/mcp") as mcp:
            result = await mcp.call_tool("block", {})
            assert result.is_error
            assert "[TIMEOUT] tool 'block' did not return within 0.2s; the session is closed" in (
                result.content[0].text  # type: ignore[union-attr]
            )
            # As it says: no call runs beside the one still blocking its thread.
            with pytest.raises(MCPError, match="has lost its environment"):
                await mcp.call_tool("echo", {"x": 1})
            # The slot is held until that thread returns, then freed with close().
            assert active_sessions(url) == 1
            assert Hostile.tracker.closed == []
            Hostile.release.set()
            await Hostile.tracker.until_closed(1)
            await until_active(url, 0)


@pytest.mark.parametrize("name", ["object_in_metadata", "lone_surrogate"])
async def test_a_tool_output_that_cannot_be_sent_is_an_execution_error(name: str) -> None:
    message = rf"tool '{name}' returned a value that cannot be sent"
    with run_server(hostile_app()) as url:
        async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
            await env.reset()
            with pytest.raises(EnvExecutionError, match=message):
                await env.call_tool(name)
            assert (await env.call_tool("echo", x=3)).data == 3
        async with Client(f"{url}/mcp") as mcp:
            result = await mcp.call_tool(name, {})
            assert result.is_error
            assert result.content[0].text.startswith(f"[EXECUTION_ERROR] tool '{name}' returned")  # type: ignore[union-attr]
            assert (await mcp.call_tool("echo", {"x": 4})).structured_content["data"] == 4  # type: ignore[index]
        await until_active(url, 0)


async def test_a_tool_that_raises_generator_exit_fails_alone_and_the_server_goes_on() -> None:
    # Carried to the loop as it was, it closed every coroutine awaiting the call:
    # over MCP that ended the server's lifespan (no session opened again), over
    # /ws it dropped the connection without a close frame.
    with run_server(hostile_app()) as url:
        async with Client(f"{url}/mcp") as mcp:
            result = await mcp.call_tool("generator_exit", {})
            assert result.is_error
            assert result.content[0].text.startswith(  # type: ignore[union-attr]
                "[EXECUTION_ERROR] tool 'generator_exit' raised RuntimeError"
            )
            assert (await mcp.call_tool("echo", {"x": 4})).structured_content["data"] == 4  # type: ignore[index]
        async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
            await env.reset()
            with pytest.raises(
                EnvExecutionError, match="tool 'generator_exit' raised RuntimeError"
            ):
                await env.call_tool("generator_exit")
            assert (await env.call_tool("echo", x=3)).data == 3
        await until_active(url, 0)


async def test_a_cancelled_call_of_a_blocking_tool_keeps_its_session_until_it_returns() -> None:
    # MCP's SDK cancels a call that times out; a plain def runs on in its thread.
    # Its session's lock was released with the request: the session's close()
    # ran beside the call, and its slot was freed while the call still ran.
    app: Any = hostile_app(cap=1)
    (bridge,) = [
        r.endpoint for r in app.routes if isinstance(getattr(r, "endpoint", None), McpBridge)
    ]
    with run_server(app) as url:
        async with Client(f"{url}/mcp") as mcp, httpx.AsyncClient(timeout=30) as http:
            ((sid, entry),) = bridge.sessions.items()
            call = asyncio.create_task(mcp.call_tool("block", {}))
            await asyncio.to_thread(Hostile.entered.wait, 10)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
            ending = asyncio.create_task(http.delete(f"{url}/mcp", headers={"mcp-session-id": sid}))
            await until_gone(url, bridge, sid)
            # The close waits for the call's thread: the environment is open, its slot held.
            assert entry.session.state is SessionState.OPEN
            assert active_sessions(url) == 1
            Hostile.release.set()
            assert (await ending).status_code == 200
            await Hostile.tracker.until_closed(1)
        await until_active(url, 0)


async def test_a_cancelled_call_still_waiting_its_turn_never_runs() -> None:
    app: Any = hostile_app()
    (bridge,) = [
        r.endpoint for r in app.routes if isinstance(getattr(r, "endpoint", None), McpBridge)
    ]
    with run_server(app) as url:
        async with Client(f"{url}/mcp") as mcp:
            ((_, entry),) = bridge.sessions.items()
            blocking = asyncio.create_task(mcp.call_tool("block", {}))
            await asyncio.to_thread(Hostile.entered.wait, 10)
            waiting = asyncio.create_task(mcp.call_tool("mark", {}))
            await until(calls_in_flight(entry, 2), what="the second call waits its turn")
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            await until(calls_in_flight(entry, 1), what="the server drops the cancelled call")
            Hostile.release.set()
            assert (await blocking).content[0].text == "released"  # type: ignore[union-attr]
            assert (await mcp.call_tool("echo", {"x": 5})).structured_content["data"] == 5  # type: ignore[index]
            assert Hostile.marked == 0
        await until_active(url, 0)


def calls_in_flight(entry: Any, count: int) -> Any:
    async def reached() -> bool:
        return len(entry.calls) == count

    return reached


async def test_a_shutdown_leaves_a_blocking_call_cancelled_by_its_client_without_close() -> None:
    # Past shutdown_timeout the session's slot is freed, its environment left to
    # the thread without close(), as for a /ws session; not closed beside the call.
    client = contextlib.AsyncExitStack()
    with run_server(hostile_app(shutdown_timeout=0.2), timeout_graceful_shutdown=0.2) as url:
        mcp = await client.enter_async_context(Client(f"{url}/mcp"))
        call = asyncio.create_task(mcp.call_tool("block", {}))
        await asyncio.to_thread(Hostile.entered.wait, 10)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
    assert Hostile.tracker.closed == []
    Hostile.release.set()
    with contextlib.suppress(Exception):  # its DELETE finds no server
        await client.aclose()


async def until_gone(url: str, bridge: McpBridge, sid: str) -> None:
    """Wait until the server has taken the session's DELETE (one more request after,
    so its event loop has run on past it)."""
    while sid in bridge.sessions:
        await asyncio.to_thread(active_sessions, url)
    await asyncio.to_thread(active_sessions, url)


async def test_a_tool_that_exits_ends_only_its_websocket_session() -> None:
    with run_server(hostile_app()) as url:
        async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
            await env.reset()
            with pytest.raises(SessionError, match="internal server error"):
                await env.call_tool("exit")
        await until_active(url, 0)


class NumpyTools(Hostile):
    @tool
    def vector(self) -> Any:
        """A NumPy array, as JSON."""
        import numpy as np

        return np.array([1.5, 2.5], dtype=np.float32)

    @tool
    def scored(self) -> ToolOutput:
        """A ToolOutput with NumPy values in its metadata, and a NaN reward."""
        import numpy as np

        return ToolOutput(reward=math.nan, metadata={"steps": np.int64(3)})


async def test_numpy_values_from_a_tool_reach_every_client() -> None:
    app = create_app(NumpyTools, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=2), mcp=True)
    with run_server(app) as url:
        async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
            await env.reset()
            assert (await env.call_tool("vector")).data == [1.5, 2.5]
            scored = await env.call_tool("scored")
            assert scored.metadata == {"steps": 3}
            assert math.isnan(scored.reward or 0.0)
        async with Client(f"{url}/mcp") as mcp:
            vector = await mcp.call_tool("vector", {})
            assert not vector.is_error
            assert vector.structured_content == {
                "reward": None,
                "finished": False,
                "data": [1.5, 2.5],
            }
            scored_mcp = await mcp.call_tool("scored", {})
            assert scored_mcp.structured_content == {
                "reward": "NaN",
                "finished": False,
                "metadata": {"steps": 3},
            }
        await until_active(url, 0)
