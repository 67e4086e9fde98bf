"""Sessions held over HTTP at ``/mcp`` (the MCP SDK's and OpenEnv's own) against
clients that vanish mid-request and calls that race one another: no slot is
held for a client that has gone, and an environment is never called beside a
call still running on its thread."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, ClassVar

import httpx
import pytest
from servers import Tracker, health, slots_free
from test_mcp import TrackedCounter
from test_mcp_limits import INITIALIZE

from counter_env.models import CounterAction, CounterObservation
from openenv import ConcurrencyConfig, create_app, tool
from openenv.testing import run_server

_MCP_HEADERS = {"accept": "application/json, text/event-stream"}


class Overrunning(TrackedCounter):
    """``block`` holds its thread until the test opens ``gate``; ``poke`` notes
    whether it ran while a ``block`` still did."""

    gate: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Semaphore] = threading.Semaphore(0)
    blocking: ClassVar[int] = 0
    pokes_beside_block: ClassVar[list[bool]] = []

    @tool
    def block(self) -> str:
        """Block until the gate opens."""
        Overrunning.blocking += 1
        Overrunning.entered.release()
        try:
            Overrunning.gate.wait(60)
        finally:
            Overrunning.blocking -= 1
        return "through"

    @tool
    def poke(self) -> str:
        """Return at once."""
        Overrunning.pokes_beside_block.append(Overrunning.blocking > 0)
        return "poked"


def _overrunning_app(**settings: Any) -> Any:
    Overrunning.tracker = Tracker()
    Overrunning.gate.clear()
    Overrunning.entered = threading.Semaphore(0)
    Overrunning.pokes_beside_block = []
    return create_app(
        Overrunning,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=2),
        mcp=True,
        mcp_sessions_per_client=2,
        **settings,
    )


def _sse_reply(text: str) -> dict[str, Any]:
    (data,) = [line for line in text.splitlines() if line.startswith("data: ")]
    reply: dict[str, Any] = json.loads(data.removeprefix("data: "))
    return reply


def _tool_call(rid: int, name: str) -> dict[str, Any]:
    params = {"name": name, "arguments": {}}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


async def test_a_tool_call_queued_behind_one_past_its_deadline_never_runs_beside_it() -> None:
    """An MCP client may send tool calls in parallel; a session's run one at a time.
    The first overruns ``step_timeout``: its session ends, and its thread runs on
    with the environment. The call waiting its turn must be refused, not run on
    that environment from a second thread."""
    app = _overrunning_app(step_timeout=2)
    with run_server(app) as url:
        try:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                opened = await http.post("/mcp", json=INITIALIZE, headers=_MCP_HEADERS)
                headers = {
                    **_MCP_HEADERS,
                    "mcp-session-id": opened.headers["mcp-session-id"],
                    "mcp-protocol-version": "2025-06-18",
                }
                initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                await http.post("/mcp", json=initialized, headers=headers)
                first = asyncio.create_task(
                    http.post("/mcp", json=_tool_call(2, "block"), headers=headers)
                )
                assert await asyncio.to_thread(Overrunning.entered.acquire, True, 30)
                # The second call's stream opens once the server has taken it.
                async with http.stream(
                    "POST", "/mcp", json=_tool_call(3, "poke"), headers=headers
                ) as second:
                    assert second.status_code == 200
                    queued = _sse_reply((await second.aread()).decode())
                timed_out = _sse_reply((await first).text)
                assert "did not return within 2s" in timed_out["result"]["content"][0]["text"]
                assert Overrunning.pokes_beside_block == []
                assert "the session has ended (fatal error)" in queued["error"]["message"]
                # Its slot is held while the thread runs on, and freed once it returns.
                assert (await health(url))["active_sessions"] == 1
        finally:
            Overrunning.gate.set()
        await Overrunning.tracker.until_closed(1)
        await slots_free(url)
        assert len(Overrunning.tracker.closed) == 1


class Slow(TrackedCounter):
    """Its making (``__init__``) or its reset, as ``hold_in`` says, waits for ``gate``."""

    hold_in: ClassVar[str] = ""
    gate: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Semaphore] = threading.Semaphore(0)

    def __init__(self) -> None:
        super().__init__()
        if Slow.hold_in == "__init__":
            self._hold()

    def reset(self, *args: Any, **kwargs: Any) -> CounterObservation:
        if Slow.hold_in == "reset":
            self._hold()
        return super().reset(*args, **kwargs)

    def _hold(self) -> None:
        Slow.entered.release()
        assert Slow.gate.wait(60)


_OPENING = {
    # OpenEnv's MCPToolClient: its create makes the environment (no reset).
    "openenv/session/create": (
        {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}},
        "__init__",
    ),
    # The MCP SDK: its initialize makes the environment and resets it.
    "initialize": (INITIALIZE, "reset"),
}


@pytest.mark.parametrize("method", list(_OPENING))
async def test_a_client_gone_while_its_session_opens_holds_no_slot(method: str) -> None:
    """A client that gives up (its timeout, a crash) while a slow environment is made
    never learns its session's id, so nobody can use or close that session: it
    must not hold its slot (and its address's share) until mcp_open_timeout."""
    body, hold_in = _OPENING[method]
    Slow.tracker, Slow.hold_in = Tracker(), hold_in
    Slow.gate.clear()
    Slow.entered = threading.Semaphore(0)
    app = create_app(
        Slow,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=2),
        mcp=True,
        mcp_sessions_per_client=1,
    )
    with run_server(app) as url:
        try:
            host, port = url.removeprefix("http://").split(":")
            payload = json.dumps(body).encode()
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /mcp HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
                b"accept: application/json, text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                % (host.encode(), len(payload), payload)
            )
            await writer.drain()
            assert await asyncio.to_thread(Slow.entered.acquire, True, 30)
            writer.close()
            await writer.wait_closed()
            # A request after the hang-up: the server has read the hang-up by its answer.
            assert (await health(url))["active_sessions"] == 1
        finally:
            Slow.gate.set()
        await Slow.tracker.until_closed(1)
        await slots_free(url)
        # And the address's one session (mcp_sessions_per_client=1) is free again.
        Slow.hold_in = ""
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            opened = await http.post("/mcp", json=body, headers=_MCP_HEADERS)
            assert opened.status_code == 200
            assert "error" not in opened.text
        assert (await health(url))["active_sessions"] == 1


async def _rpc(http: httpx.AsyncClient, method: str, **params: Any) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    reply: dict[str, Any] = (await http.post("/mcp", json=body)).json()
    return reply


async def _sent(
    url: str, body: dict[str, Any]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A POST to ``/mcp`` written whole to the server; its answer to be read."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /mcp HTTP/1.1\r\nhost: %s\r\nconnection: close\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (host.encode(), len(payload), payload)
    )
    await writer.drain()
    return reader, writer


async def test_closes_racing_a_tool_call_close_once_and_say_why() -> None:
    """OpenEnv's ``/mcp`` session closed (twice, at once) while a tool call runs: the
    call finishes, the environment is closed once, and later requests are told
    the session was closed by its client, not that it failed."""
    app = _overrunning_app()
    with run_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            sid = (await _rpc(http, "openenv/session/create"))["result"]["session_id"]
            running = asyncio.create_task(
                _rpc(http, "tools/call", session_id=sid, name="block", arguments={})
            )
            try:
                assert await asyncio.to_thread(Overrunning.entered.acquire, True, 30)
                close = {"jsonrpc": "2.0", "id": 7, "method": "openenv/session/close"}
                closes = [await _sent(url, {**close, "params": {"session_id": sid}}) for _ in "ab"]
                # Answered after them: the server has begun both closes, which wait
                # for the call in flight.
                await health(url)
            finally:
                Overrunning.gate.set()
            assert (await running)["result"]["data"] == "through"
            for answer, writer in closes:
                assert b'"closed":true' in await answer.read()
                writer.close()
            after = await _rpc(http, "tools/call", session_id=sid, name="poke", arguments={})
            assert "has ended (client close)" in after["error"]["message"]
        await slots_free(url)
        assert len(Overrunning.tracker.closed) == 1
        assert Overrunning.pokes_beside_block == []


async def test_an_initialize_at_a_full_server_is_a_503_to_retry_after() -> None:
    """A full server tells every HTTP caller when to come back (compat.md: OpenEnv's
    ``/reset`` and OpenReward's ``/create`` say ``Retry-After: 1``), MCP's too."""
    Slow.tracker, Slow.hold_in = Tracker(), ""
    concurrency = ConcurrencyConfig(max_concurrent_envs=1, queue_timeout=0.2)
    app = create_app(
        Slow, CounterAction, CounterObservation, concurrency, mcp=True, mcp_sessions_per_client=2
    )
    with run_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            held = await http.post("/mcp", json=INITIALIZE, headers=_MCP_HEADERS)
            assert "mcp-session-id" in held.headers
            refused = await http.post("/mcp", json=INITIALIZE, headers=_MCP_HEADERS)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert "at capacity (1 sessions)" in refused.json()["error"]["message"]
            assert (await health(url))["active_sessions"] == 1
