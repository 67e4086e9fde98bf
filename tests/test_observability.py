"""``/metrics`` in Prometheus text format, and the session id on every log line."""

from __future__ import annotations

import functools
import logging

import httpx
import orjson
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families
from servers import Ping, PingEnvironment, Pong, Tracker, ping_app, slots_free
from tool_envs import ToolBox
from v2_wire import open_sessions, raw_v2, replies, send
from websockets.exceptions import ConnectionClosedError

from openenv import (
    CapacityError,
    ConcurrencyConfig,
    EnvExecutionError,
    EnvValidationError,
    SessionError,
    WebSocketEnvClient,
    create_app,
)
from openenv.testing import run_server


def client(url: str) -> WebSocketEnvClient:
    return WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong)


async def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_count_sessions_steps_and_errors() -> None:
    app = create_app(
        functools.partial(PingEnvironment, Tracker()),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=2),
    )
    with run_server(app) as url:
        async with httpx.AsyncClient() as http:
            response = await http.get(f"{url}/metrics")
        assert response.headers["content-type"].startswith("text/plain")
        async with client(url) as a, client(url) as b:
            await a.reset()
            await b.reset()
            for _ in range(3):
                await a.step(Ping())
            with pytest.raises(EnvValidationError):
                await a.step({"message": 1})
            with pytest.raises(EnvExecutionError):
                await b.step(Ping(fail=True))
            with pytest.raises(CapacityError):
                await client(url).reset()
            during = await samples(url)
        await slots_free(url)
        after = await samples(url)
    assert during[("openenv_sessions_active", ())] == 2
    assert during[("openenv_sessions_capacity", ())] == 2
    assert during[("openenv_sessions_queued", ())] == 0
    assert during[("openenv_steps_total", ())] == 3
    assert during[("openenv_step_seconds_count", ())] == 3
    assert during[("openenv_errors_total", (("code", "VALIDATION_ERROR"),))] == 1
    assert during[("openenv_errors_total", (("code", "EXECUTION_ERROR"),))] == 1
    assert during[("openenv_errors_total", (("code", "CAPACITY_REACHED"),))] == 1
    assert after[("openenv_sessions_active", ())] == 0
    assert after[("openenv_sessions_opened_total", ())] == 2
    assert after[("openenv_sessions_closed_total", (("reason", "client_close"),))] == 2


async def test_log_lines_carry_the_session_id(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(PingEnvironment, Ping, Pong)
    with run_server(app) as url, caplog.at_level(logging.ERROR, logger="openenv.server"):
        async with client(url) as env:
            with pytest.raises(EnvExecutionError):
                await env.step(Ping(fail=True))
    records = [r for r in caplog.records if "step() raised" in r.getMessage()]
    assert len(records) == 1
    session_id = records[0].session_id  # type: ignore[attr-defined]
    assert len(session_id) == 12
    assert records[0].getMessage() == f"[session {session_id}] step() raised"
    assert records[0].exc_info is not None  # the traceback stays in the log


async def test_v2_error_replies_are_counted_like_v1_ones() -> None:
    with run_server(ping_app(Tracker(), max_envs=2, max_bad_frames=2)) as url:
        ws = await raw_v2(url)
        try:
            await open_sessions(ws, 1)
            await send(
                ws,
                [
                    {"session": 0, "type": "open", "id": 1},  # already open
                    {"session": 7, "type": "step", "data": {}, "id": 2},  # never opened
                    {"session": 0, "type": "step", "data": {}, "id": 3},
                ],
            )
            got = {reply["id"]: reply for reply in await replies(ws, 3)}
            assert got[1]["data"]["code"] == "VALIDATION_ERROR"
            assert got[2]["data"]["code"] == "SESSION_ERROR"
            assert got[3]["type"] == "observation"
            for _ in range(2):  # bad frames in a row: the second ends the connection
                await send(ws, "not json")
            codes = []
            while len(codes) < 3:
                codes += [reply["data"]["code"] for reply in orjson.loads(await ws.recv())]
            with pytest.raises(ConnectionClosedError):
                await ws.recv()
            assert codes == ["INVALID_JSON", "INVALID_JSON", "SESSION_ERROR"]
        finally:
            await ws.close()
        await slots_free(url)
        counted = await samples(url)
    assert counted[("openenv_errors_total", (("code", "VALIDATION_ERROR"),))] == 1
    assert counted[("openenv_errors_total", (("code", "SESSION_ERROR"),))] == 2
    assert counted[("openenv_errors_total", (("code", "INVALID_JSON"),))] == 2
    assert counted[("openenv_steps_total", ())] == 1
    # Ended by the bad frames: closed as an error, its slot back.
    assert counted[("openenv_sessions_closed_total", (("reason", "error"),))] == 1
    assert counted[("openenv_sessions_active", ())] == 0


async def test_mcp_tool_errors_are_counted_like_ws_ones() -> None:
    app = create_app(ToolBox, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=2), mcp=True)
    with run_server(app) as url:
        async with Client(f"{url}/mcp") as mcp:
            assert (await mcp.call_tool("fail", {})).is_error  # EXECUTION_ERROR
            assert (await mcp.call_tool("add", {"a": "x"})).is_error  # VALIDATION_ERROR
            with pytest.raises(MCPError):
                await mcp.call_tool("jump", {})  # UNKNOWN_TOOL
            assert (await mcp.call_tool("add", {"a": 1})).is_error is False
        seen = await samples(url)
    errors = {dict(k[1])["code"]: v for k, v in seen.items() if k[0] == "openenv_errors_total"}
    assert errors == {"EXECUTION_ERROR": 1, "VALIDATION_ERROR": 1, "UNKNOWN_TOOL": 1}


class Exits(PingEnvironment):
    """A step that asks to fail calls ``sys.exit``: the session ends, not the server."""

    def step(self, action: Ping, **kwargs: object) -> Pong:
        if action.fail:
            raise SystemExit(3)
        return super().step(action)


async def test_an_internal_error_is_counted_with_the_error_frame_it_sends() -> None:
    """``sys.exit()`` in a step sends SESSION_ERROR "internal server error", on v1 and
    v2; openenv_errors did not count it, and a dashboard saw no error at all."""
    with run_server(ping_app(Tracker(), env_cls=Exits)) as url:
        with pytest.raises(SessionError):
            async with client(url) as env:
                await env.step(Ping(fail=True))
        ws = await raw_v2(url)
        try:
            await open_sessions(ws, 1)
            await send(ws, [{"session": 0, "type": "step", "data": {"fail": True}, "id": 1}])
            error, notice = await replies(ws, 2)
        finally:
            await ws.close()
        await slots_free(url)
        counted = await samples(url)
    assert (error["data"]["code"], notice["type"]) == ("SESSION_ERROR", "closed")
    assert counted[("openenv_errors_total", (("code", "SESSION_ERROR"),))] == 2
    assert counted[("openenv_sessions_closed_total", (("reason", "error"),))] == 2
