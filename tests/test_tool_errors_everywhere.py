"""A model's mistakes in tool calls are refused alike on /ws, v2, MCP and OpenReward's
routes, and never end the session however many come in a row: an agent is learning."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from mcp import Client

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import (
    ConcurrencyConfig,
    EnvValidationError,
    MuxClient,
    WebSocketEnvClient,
    create_app,
)
from openenv.testing import run_server

BAD_CALLS = 5  # more than max_bad_frames in a row


def counter_app() -> object:
    return create_app(
        CounterEnvironment,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=4),
        mcp=True,
        max_bad_frames=3,
    )


async def test_bad_tool_arguments_in_a_row_keep_websocket_sessions_open() -> None:
    with run_server(counter_app()) as url:
        async with WebSocketEnvClient(
            url, action_cls=CounterAction, observation_cls=CounterObservation
        ) as env:
            await env.reset()
            for _ in range(BAD_CALLS):
                with pytest.raises(EnvValidationError, match="arguments for tool 'increment'"):
                    await env.call_tool("increment", amount="lots")
            assert (await env.call_tool("increment", amount=2)).data == {"value": 2}
        async with MuxClient(
            url, action_cls=CounterAction, observation_cls=CounterObservation
        ) as mux:
            (session,) = await mux.open(1)
            for _ in range(BAD_CALLS):
                with pytest.raises(EnvValidationError, match="amount: Field required"):
                    await session.call_tool("increment", {})
            assert (await session.call_tool("increment", amount=3)).data == {"value": 3}


async def test_bad_tool_arguments_in_a_row_keep_mcp_and_openreward_sessions_open() -> None:
    with run_server(counter_app()) as url:
        async with Client(f"{url}/mcp") as mcp:
            for _ in range(BAD_CALLS):
                refused = await mcp.call_tool("increment", {"amount": "lots"})
                assert refused.is_error
            done = await mcp.call_tool("increment", {"amount": 2})
            assert done.structured_content["data"] == {"value": 2}  # type: ignore[index]
        async with httpx.AsyncClient(base_url=url) as http:
            opened = (await http.post("/create_session")).text
            found = re.search(r"event: task_id\r?\ndata: (\w+)", opened)
            assert found is not None, opened
            headers = {"X-Session-ID": found.group(1)}
            task = {"split": "train", "index": 0}
            assert (await http.post("/create", json=task, headers=headers)).status_code == 200

            async def call(amount: object) -> dict[str, object]:
                body = {"name": "increment", "input": {"amount": amount}}
                stream = (await http.post("/call", json=body, headers=headers)).text
                end = re.search(r"event: end\r?\ndata: (.*)\r?\n", stream)
                assert end is not None, stream  # not an error event, nor a 410
                result: dict[str, object] = json.loads(end.group(1))
                return result

            for _ in range(BAD_CALLS):
                assert (await call("lots"))["reason"] == "input_validation"
            assert (await call(2))["ok"] is True
            await http.post("/delete", headers=headers)
