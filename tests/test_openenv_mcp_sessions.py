"""OpenEnv's own ``/mcp`` sessions on the wire, as hostile clients use them.

OpenEnv's real client is played in ``test_openenv_peer_client.py``; here the
requests are written by hand: attaching twice, to nobody, malformed bodies,
storms past the cap, and the MCP SDK's own sessions beside these.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from servers import Tracker, health, slots_free, until
from test_mcp import TrackedCounter
from test_mcp_limits import INITIALIZE
from test_shutdown import graceful
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, create_app, tool
from openenv.testing import run_server


def counter_app(cap: int = 4, env: Any = CounterEnvironment, **settings: Any) -> Any:
    settings.setdefault("mcp_sessions_per_client", cap)
    queue = settings.pop("queue_timeout", 0)
    return create_app(
        env,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=cap, session_timeout=None, queue_timeout=queue),
        mcp=True,
        **settings,
    )


async def rpc(http: httpx.AsyncClient, method: str, **params: Any) -> dict[str, Any]:
    """One of OpenEnv's JSON-RPC calls, as its client sends it (HTTP 200 or it raises)."""
    body = {"jsonrpc": "2.0", "method": method, "params": params, "id": 7}
    response = await http.post("/mcp", json=body)
    response.raise_for_status()
    reply: dict[str, Any] = response.json()
    assert reply["id"] == 7
    return reply


async def create(http: httpx.AsyncClient) -> str:
    sid: str = (await rpc(http, "openenv/session/create"))["result"]["session_id"]
    return sid


def ws_url(url: str, sid: str) -> str:
    return url.replace("http", "ws", 1) + f"/ws?session_id={sid}"


async def ask(ws: ClientConnection, kind: str, data: Any = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": kind} if data is None else {"type": kind, "data": data}
    await ws.send(json.dumps(frame))
    reply: dict[str, Any] = json.loads(await ws.recv())
    return reply


async def refused(url: str) -> tuple[dict[str, Any], int | None]:
    """What a WebSocket to ``url`` hears: its one error frame, and its close code."""
    async with connect(url) as ws:
        error = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        return error, ws.close_code


async def test_an_unknown_or_second_attach_is_refused_and_the_first_goes_on() -> None:
    with run_server(counter_app()) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            error, code = await refused(ws_url(url, "0" * 48))
            assert error["data"]["code"] == "SESSION_ERROR"
            assert error["data"]["message"].startswith("Unknown session_id: '0000")
            assert code == 1008
            assert (await health(url))["active_sessions"] == 0  # it took no slot
            sid = await create(http)
            async with connect(ws_url(url, sid)) as first:
                assert (await ask(first, "reset"))["data"]["observation"]["value"] == 0
                # Another client with that id (leaked, or guessed): refused.
                error, code = await refused(ws_url(url, sid))
                assert error["data"]["message"] == (
                    f"session {sid!r} already has an attached WebSocket; close it first "
                    f"(one WebSocket at a time drives a session)"
                )
                assert code == 1008
                reply = await ask(first, "step", {"amount": 2})
                assert reply["data"]["observation"]["value"] == 2
            assert (await health(url))["active_sessions"] == 1  # its session stays


async def test_a_session_outlives_its_websocket_until_closed_over_http() -> None:
    with run_server(counter_app()) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            sid = await create(http)
            async with connect(ws_url(url, sid)) as ws:
                await ask(ws, "reset")
                await ask(ws, "step", {"amount": 3})
                await ws.send(json.dumps({"type": "close"}))
            # Detached, not closed (OpenEnv's semantics): the tools see the steps.
            called = await rpc(http, "tools/call", name="get_value", session_id=sid)
            assert called["result"]["data"] == 3
            async with connect(ws_url(url, sid)) as again:  # attach once more
                assert (await ask(again, "step", {"amount": 1}))["data"]["observation"][
                    "value"
                ] == 4
                # Closed over HTTP while attached: it ends when the WebSocket leaves.
                closing = await rpc(http, "openenv/session/close", session_id=sid)
                assert closing["result"] == {"session_id": sid, "closed": False, "closing": True}
                assert (await health(url))["active_sessions"] == 1
            await slots_free(url)
            gone = await rpc(http, "tools/call", name="get_value", session_id=sid)
            assert gone["error"]["code"] == -32602
            assert gone["error"]["message"].startswith(f"session {sid!r} has ended (client close)")
            assert (await rpc(http, "openenv/session/close", session_id=sid))["error"]


class Gated(CounterEnvironment):
    """A counter whose ``hold`` tool waits until released, noting any overlap."""

    inside = 0
    overlapped = False
    entered = threading.Event()
    release = threading.Event()

    def _enter(self) -> None:
        Gated.inside += 1
        Gated.overlapped |= Gated.inside > 1

    @tool
    async def hold(self) -> int:
        """Wait, on the server's event loop, until the test releases it."""
        self._enter()
        Gated.entered.set()
        # Suspended here, a step could run meanwhile, unless serialized.
        await asyncio.to_thread(Gated.release.wait, 10)
        Gated.inside -= 1
        return self.state.value

    def step(self, action: CounterAction, **kwargs: Any) -> CounterObservation:
        self._enter()
        try:
            return super().step(action)
        finally:
            Gated.inside -= 1


async def test_a_step_waits_for_the_tool_call_in_flight_on_its_session() -> None:
    Gated.entered.clear()
    Gated.release.clear()
    with run_server(counter_app(env=Gated)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            sid = await create(http)
            async with connect(ws_url(url, sid)) as ws:
                await ask(ws, "reset")
                holding = asyncio.create_task(rpc(http, "tools/call", name="hold", session_id=sid))
                await asyncio.to_thread(Gated.entered.wait, 10)
                await ws.send(json.dumps({"type": "step", "data": {"amount": 5}}))
                # Its pong comes after the server has read the step: the step
                # is in the session's queue now, or (unserialized) on a thread.
                await (await ws.ping())
                Gated.release.set()
                stepped = json.loads(await ws.recv())
                held = await holding
    assert held["result"]["data"] == 0  # the tool ran first, alone
    assert stepped["data"]["observation"]["value"] == 5
    assert not Gated.overlapped


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        (b'{"method": "openenv/session/create", "params": {}, "id": 3}', -32600, "not a JSON"),
        (
            b'{"jsonrpc": "2.0", "method": "openenv/session/close", "params": [], "id": 3}',
            -32600,
            "not a JSON-RPC 2.0 request: params: Input should be a valid dictionary",
        ),
        (
            b'{"jsonrpc": "2.0", "method": "tools/list", "params": {"session_id": 5}, "id": 3}',
            -32602,
            "Invalid params - session_id: Input should be a valid string",
        ),
        (
            b'{"jsonrpc": "2.0", "method": "tools/call", "params": {"session_id": "x"}, "id": 3}',
            -32602,
            "Invalid params - name: Field required",
        ),
        (
            b'{"jsonrpc": "2.0", "method": "tools/list", "params": {"session_id": "'
            + b"a" * 5000
            + b'"}, "id": 3}',
            -32602,
            "Invalid params - session_id: String should have at most 256 characters",
        ),
        (
            b'{"jsonrpc": "2.0", "method": "openenv/session/drop", "params": {}, "id": 3}',
            -32601,
            "Method not found: openenv/session/drop",
        ),
        (
            b'{"jsonrpc": "2.0", "method": "tools/list", "params": {"session_id": "x"}, "id": 3}',
            -32602,
            "Unknown session_id: 'x'",
        ),
    ],
)
async def test_malformed_openenv_requests_get_json_rpc_errors_and_open_nothing(
    body: bytes, code: int, message: str
) -> None:
    with run_server(counter_app(max_message_size=65_536)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            response = await http.post(
                "/mcp", content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 200  # OpenEnv's client reads it after raise_for_status
            error = response.json()["error"]
            assert error["code"] == code
            assert error["message"].startswith(message)
            assert (await health(url))["active_sessions"] == 0
            # A body past max_message_size is refused before it is read whole.
            huge = b'{"jsonrpc": "2.0", "method": "openenv/session/create", "x": "'
            response = await http.post("/mcp", content=huge + b"a" * 70_000 + b'"}')
            assert response.status_code == 413
            assert (await health(url))["active_sessions"] == 0
            assert await create(http)  # and the server goes on


async def test_a_create_storm_past_the_cap_is_refused_precisely_and_frees_every_slot() -> None:
    with run_server(counter_app(3, mcp_sessions_per_client=20)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            replies = await asyncio.gather(
                *(rpc(http, "openenv/session/create") for _ in range(20))
            )
            made = [r["result"]["session_id"] for r in replies if "result" in r]
            errors = [r["error"] for r in replies if "error" in r]
            assert len(set(made)) == 3
            assert len(errors) == 17
            assert {e["code"] for e in errors} == {-32000}
            assert errors[0]["message"] == "server at capacity (3 sessions); retry later"
            assert errors[0]["data"] == {
                "code": "CAPACITY_REACHED",
                "active_sessions": 3,
                "max_sessions": 3,
            }
            # Ids are unguessable: another's id, one character off, names nothing.
            forged = made[0][:-1] + ("0" if made[0][-1] != "0" else "1")
            reply = await rpc(http, "tools/list", session_id=forged)
            assert reply["error"]["message"].startswith("Unknown session_id")
            for sid in made:
                closed = await rpc(http, "openenv/session/close", session_id=sid)
                assert closed["result"] == {"session_id": sid, "closed": True, "closing": False}
            assert (await health(url))["active_sessions"] == 0


async def test_one_address_may_hold_only_mcp_sessions_per_client() -> None:
    with run_server(counter_app(4, mcp_sessions_per_client=1)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            await create(http)
            reply = await rpc(http, "openenv/session/create")
            assert reply["error"]["message"].startswith(
                "this client already holds 1 sessions at /mcp, the most one address may "
                "(mcp_sessions_per_client)"
            )
            # MCP's own sessions count against the same limit.
            async with httpx.AsyncClient(base_url=url) as sdk:
                refused = await sdk.post(
                    "/mcp",
                    json=INITIALIZE,
                    headers={"accept": "application/json, text/event-stream"},
                )
            assert refused.status_code == 429
            assert (await health(url))["active_sessions"] == 1


async def test_sessions_nobody_uses_after_create_end_after_the_open_timeout() -> None:
    with run_server(counter_app(4, mcp_open_timeout=0.5)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            sid = await create(http)
            await create(http)
            await rpc(http, "tools/list", session_id=sid)  # used: the idle timeout (30 min)
            assert (await health(url))["active_sessions"] == 2

            async def one_left() -> bool:
                return (await health(url))["active_sessions"] == 1

            await until(one_left, what="the unused session closed")
            assert "result" in await rpc(http, "tools/list", session_id=sid)


async def test_the_mcp_sdk_client_works_beside_openenv_sessions() -> None:
    with run_server(counter_app()) as url:
        async with httpx.AsyncClient(base_url=url) as http, Client(f"{url}/mcp") as mcp:
            sid = await create(http)
            await rpc(http, "tools/call", name="increment", arguments={"amount": 7}, session_id=sid)
            result = await mcp.call_tool("increment", {"amount": 1})
            assert result.structured_content is not None
            assert result.structured_content["data"] == {"value": 1}  # its own environment
            value = await rpc(http, "tools/call", name="get_value", session_id=sid)
            assert value["result"]["data"] == 7
            assert (await health(url))["active_sessions"] == 2
            await rpc(http, "openenv/session/close", session_id=sid)
        await slots_free(url)


async def test_a_failing_tool_is_a_json_rpc_error_and_the_session_goes_on() -> None:
    with run_server(counter_app()) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            sid = await create(http)
            big = 2**63 - 1
            await rpc(
                http, "tools/call", name="increment", arguments={"amount": big}, session_id=sid
            )
            failed = await rpc(
                http, "tools/call", name="increment", arguments={"amount": 1}, session_id=sid
            )
            assert failed["error"]["code"] == -32603
            assert failed["error"]["message"].startswith("[EXECUTION_ERROR] ")
            assert failed["error"]["data"] == {"code": "EXECUTION_ERROR"}
            submitted = await rpc(http, "tools/call", name="submit", session_id=sid)
            assert submitted["result"]["structuredContent"]["finished"] is True
            assert submitted["result"]["data"].startswith("wrong: the counter is")


async def test_a_shutdown_closes_attached_and_detached_sessions() -> None:
    TrackedCounter.tracker = Tracker()
    with run_server(counter_app(env=TrackedCounter)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            await create(http)  # HTTP only
            sid = await create(http)
            ws = await connect(ws_url(url, sid))
            await ask(ws, "reset")
        # The server stops here, its WebSocket still attached.
    await TrackedCounter.tracker.until_closed(2)
    with pytest.raises(ConnectionClosed):
        await ws.recv()


class Stuck(TrackedCounter):
    """A counter whose ``block`` tool blocks its thread until the test releases it."""

    release = threading.Event()
    returned = threading.Event()
    running: list[int] = []

    @tool
    def block(self) -> int:
        """Block until released."""
        Stuck.running.append(1)
        Stuck.release.wait(60)
        Stuck.returned.set()
        return 1


def stuck_app(**settings: Any) -> Any:
    Stuck.release.clear()
    Stuck.returned.clear()
    Stuck.running.clear()
    TrackedCounter.tracker = Tracker()
    return counter_app(env=Stuck, **settings)


async def test_a_tool_call_past_step_timeout_is_answered_at_once_and_its_websocket_told() -> None:
    """The TIMEOUT reply waited for the blocking call to return (for ever, for one
    that never does), and the attached WebSocket's next step had its connection
    dropped with no frame and no close code."""
    try:
        with run_server(stuck_app(step_timeout=0.2)) as url:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                sid = await create(http)
                async with connect(ws_url(url, sid)) as ws:
                    await ask(ws, "reset")
                    timed_out = await rpc(http, "tools/call", name="block", session_id=sid)
                    assert not Stuck.returned.is_set()  # answered while the call still runs
                    assert timed_out["error"]["data"] == {"code": "TIMEOUT", "fatal": True}
                    ended = await ask(ws, "step", {"amount": 1})
                    assert ended["data"] == {
                        "code": "SESSION_ERROR",
                        "message": "the session has ended (closed: fatal error)",
                    }
                    with pytest.raises(ConnectionClosed):
                        await ws.recv()
                    assert ws.close_code == 1011
                gone = await rpc(http, "tools/list", session_id=sid)
                assert "has ended (fatal error)" in gone["error"]["message"]
                error, code = await refused(ws_url(url, sid))
                assert "has ended (fatal error)" in error["data"]["message"]
                assert code == 1008
                assert (await health(url))["active_sessions"] == 1  # until the thread returns
                Stuck.release.set()
                await slots_free(url)
                await TrackedCounter.tracker.until_closed(1)  # close() after the call, not beside
    finally:
        Stuck.release.set()


async def test_a_shutdown_answers_tool_calls_still_running_past_shutdown_timeout() -> None:
    """A blocking tool call in flight held ``openenv serve``'s shutdown for as
    long as it ran (for ever, for one that never returns): the drain waited for it
    without a deadline, and its open response held uvicorn's."""
    try:
        with graceful(stuck_app(shutdown_timeout=0.5)) as (url, server):
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                idle = await create(http)
                detached, attached = await create(http), await create(http)
                ws = await connect(ws_url(url, attached))
                await ask(ws, "reset")
                calls = [
                    asyncio.create_task(rpc(http, "tools/call", name="block", session_id=sid))
                    for sid in (detached, attached)
                ]

                async def both_running() -> bool:
                    return len(Stuck.running) == 2

                await until(both_running, what="both calls on their threads")
                server.should_exit = True
                answered = await asyncio.gather(*calls)
            assert idle
            for reply in answered:
                assert reply["error"]["message"] == (
                    "[SESSION_ERROR] the session has ended (shutdown)"
                )
            assert not Stuck.returned.is_set()
        # The idle session's environment was closed; those in a call were given up.
        assert len(TrackedCounter.tracker.closed) == 1
    finally:
        Stuck.release.set()


async def test_a_session_id_never_reaches_uvicorns_logs(capfd: pytest.CaptureFixture[str]) -> None:
    """The id is the one key to its session (whoever has it may attach, call its
    tools, close it), and uvicorn logged ``/ws?session_id=<id>`` whole."""
    with run_server(counter_app(), log_level="info", access_log=True) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            sid = await create(http)
            async with connect(ws_url(url, sid)) as ws:
                await ask(ws, "reset")
            await rpc(http, "openenv/session/close", session_id=sid)
    logged = "".join(capfd.readouterr())
    assert '"WebSocket /ws?session_id=***" [accepted]' in logged
    assert sid not in logged


async def test_run_server_answers_a_tool_call_still_running_past_shutdown_timeout() -> None:
    """``run_server`` bounded only WebSocket sessions by ``shutdown_timeout``: a
    blocking tool call in flight over HTTP held its exit, which raised
    ``RuntimeError`` ten seconds past the deadline."""
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            with run_server(stuck_app(shutdown_timeout=0.5)) as url:
                http.base_url = httpx.URL(url)
                sid = await create(http)
                call = asyncio.create_task(rpc(http, "tools/call", name="block", session_id=sid))

                async def running() -> bool:
                    return bool(Stuck.running)

                await until(running, what="the call on its thread")
            # The server has stopped (this loop was blocked meanwhile): its answer waits.
            reply = await call
        assert reply["error"]["message"] == "[SESSION_ERROR] the session has ended (shutdown)"
        assert not Stuck.returned.is_set()
        assert TrackedCounter.tracker.closed == []  # no close() beside the call
    finally:
        Stuck.release.set()


class SlowClose(TrackedCounter):
    """A counter whose ``close()`` waits until the test lets it finish."""

    closing = threading.Event()
    finish = threading.Event()

    def close(self) -> None:
        SlowClose.closing.set()
        SlowClose.finish.wait(30)
        super().close()


async def test_a_websocket_may_not_attach_to_a_session_being_closed() -> None:
    """A session closed over HTTP while attached ends when its WebSocket leaves;
    another WebSocket attaching meanwhile was let in, to a session whose close
    was under way, and its frames waited behind that close."""
    SlowClose.closing.clear()
    SlowClose.finish.clear()
    TrackedCounter.tracker = Tracker()
    try:
        with run_server(counter_app(env=SlowClose)) as url:
            async with httpx.AsyncClient(base_url=url) as http:
                sid = await create(http)
                async with connect(ws_url(url, sid)) as first:
                    await ask(first, "reset")
                    closing = await rpc(http, "openenv/session/close", session_id=sid)
                    assert closing["result"]["closing"] is True
                await asyncio.to_thread(SlowClose.closing.wait, 10)  # its close() runs
                # Refused at once (it was let in, and heard nothing until the close ended).
                error, code = await asyncio.wait_for(refused(ws_url(url, sid)), 10)
                assert error["data"] == {
                    "code": "SESSION_ERROR",
                    "message": f"session {sid!r} is closing; create a new one "
                    f"(openenv/session/create)",
                }
                assert code == 1008
                SlowClose.finish.set()
                await slots_free(url)
    finally:
        SlowClose.finish.set()


async def test_a_blocking_mcp_sdk_tool_call_does_not_hold_run_servers_exit() -> None:
    """MCP's own sessions ended only once uvicorn had waited for every open
    response, their calls' included: exiting ``run_server`` raised
    ``RuntimeError`` ten seconds past ``shutdown_timeout``."""
    stack = contextlib.ExitStack()
    try:
        url = stack.enter_context(run_server(stuck_app(shutdown_timeout=0.5)))
        async with Client(f"{url}/mcp") as mcp:
            call = asyncio.create_task(mcp.call_tool("block", {}))

            async def running() -> bool:
                return bool(Stuck.running)

            await until(running, what="the call on its thread")
            await asyncio.to_thread(stack.close)  # the server stops, the call unanswered
            with pytest.raises(MCPError):
                await call
        assert not Stuck.returned.is_set()
        assert TrackedCounter.tracker.closed == []  # no close() beside the call
    finally:
        Stuck.release.set()
        stack.close()
