"""A tool called after a tool ended the episode is refused as ``EPISODE_FINISHED`` on
every surface, each time saying what a caller of that surface can do next: a
WebSocket client resets; an MCP or OpenReward session plays one episode, so its
caller opens a new session (neither surface has a reset)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest
from mcp import Client

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, EpisodeFinishedError, RemoteEnv, create_app
from openenv.testing import run_server


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = create_app(
        CounterEnvironment,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=4),
        mcp=True,
    )
    with run_server(app) as url:
        yield url


async def test_a_websocket_client_is_told_to_reset(url: str) -> None:
    async with RemoteEnv(url).session() as session:
        await session.call_tool("submit")
        with pytest.raises(EpisodeFinishedError) as refused:
            await session.call_tool("increment", amount=1)
        assert "reset() to start a new one" in str(refused.value)
        await session.reset()  # what it said: the session plays on
        assert (await session.call_tool("increment", amount=1)).data == {"value": 1}


async def test_an_mcp_client_is_told_to_open_a_new_session(url: str) -> None:
    async with Client(f"{url}/mcp") as mcp:
        await mcp.call_tool("submit", {})
        again = await mcp.call_tool("increment", {"amount": 1})
    assert again.is_error
    text = again.content[0].text  # type: ignore[union-attr]
    assert text.startswith("[EPISODE_FINISHED] the episode is over (the 'submit' tool ended it)")
    # MCP has no reset: each session is reset once, as it opens.
    assert "reset" not in text
    assert "an MCP session plays one episode: open a new session (initialize)" in text
    async with Client(f"{url}/mcp") as mcp:  # what it said: a new episode
        played = await mcp.call_tool("increment", {"amount": 1})
    assert played.structured_content["data"] == {"value": 1}  # type: ignore[index]


def end_event(stream: str) -> dict[str, object]:
    """The data of an OpenReward call's ``end`` event."""
    match = re.search(r"event: end\r\ndata: (.*)\r\n", stream)
    assert match is not None, stream
    data: dict[str, object] = json.loads(match.group(1))
    return data


def open_session(http: httpx.Client) -> dict[str, str]:
    """POST /create_session, then /create: an OpenReward session with its episode."""
    opened = re.search(r"event: task_id\r\ndata: (\w+)", http.post("/create_session").text)
    assert opened is not None
    headers = {"X-Session-ID": opened.group(1)}
    assert http.post("/create", json={"split": "train", "index": 0}, headers=headers).is_success
    return headers


def test_an_openreward_client_is_told_to_open_a_new_session(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        headers = open_session(http)
        submitted = http.post("/call", json={"name": "submit", "input": {}}, headers=headers)
        assert end_event(submitted.text)["ok"] is True
        call = {"name": "increment", "input": {"amount": 1}}
        refused = end_event(http.post("/call", json=call, headers=headers).text)
        assert refused["reason"] == "episode_finished"  # the SDK's ToolCallError.reason
        message = str(refused["error"])
        assert "reset" not in message  # OpenReward's protocol has none
        assert "an OpenReward session plays one episode: open a new session" in message
        assert "POST /create_session, then /create" in message
        assert http.post("/delete", headers=headers).is_success
        headers = open_session(http)  # what it said: a new episode
        played = end_event(http.post("/call", json=call, headers=headers).text)
        assert played["ok"] is True
        assert http.post("/delete", headers=headers).is_success
