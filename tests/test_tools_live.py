"""Tools over real WebSocket sessions: listing, calling, refusing, finishing."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from servers import Ping, Pong
from tool_envs import HTTP, Puzzle, ToolBox
from websockets.asyncio.client import connect

from echo_env import EchoEnv
from openenv import (
    EnvExecutionError,
    EnvValidationError,
    EpisodeFinishedError,
    ImageContent,
    UnknownToolError,
    WebSocketEnvClient,
    create_app,
)
from openenv.client import ws_url
from openenv.testing import run_server
from openenv.tools import tools_of


@pytest.fixture(scope="module")
def toolbox_url() -> Iterator[str]:
    from openenv import ConcurrencyConfig

    app = create_app(ToolBox, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=8))
    with run_server(app) as url:
        yield url


def client(url: str) -> WebSocketEnvClient:
    return WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong)


async def exchange(ws: object, frame: dict[str, object]) -> dict[str, object]:
    await ws.send(orjson.dumps(frame).decode())  # type: ignore[attr-defined]
    reply: dict[str, object] = orjson.loads(await ws.recv())  # type: ignore[attr-defined]
    return reply


async def test_tools_are_listed_with_their_schemas(toolbox_url: str) -> None:
    expected = [spec.info for spec in tools_of(ToolBox).values()]
    async with client(toolbox_url) as env:
        assert await env.list_tools() == expected
    listed = HTTP.get(f"{toolbox_url}/tools").json()["tools"]
    assert listed == [info.model_dump() for info in expected]
    add = next(t for t in listed if t["name"] == "add")
    assert add["input_schema"]["required"] == ["a"]
    assert add["input_schema"]["properties"]["b"]["default"] == 2


async def test_sync_tools_run_in_worker_threads_async_tools_on_the_loop(toolbox_url: str) -> None:
    async with client(toolbox_url) as env:
        await env.reset()
        sync_thread = (await env.call_tool("where_sync")).text
        async_thread = (await env.call_tool("where_async")).text
        assert (await env.call_tool("shout", text="hey")).text == "HEY"
        assert (await env.call_tool("add", {"a": 1})).data == 3
        assert (await env.call_tool("add", {"a": 1}, b=5)).data == 6
    assert sync_thread.startswith("openenv-env")
    assert async_thread == "openenv-test-server"


async def test_model_arguments_and_image_content(toolbox_url: str) -> None:
    async with client(toolbox_url) as env:
        await env.reset()
        assert (await env.call_tool("save", title="a")).data == {"saved": "a", "count": 1}
        assert (await env.call_tool("save", {"title": "b", "body": "x"})).data["count"] == 2
        picture = await env.call_tool("picture")
    assert picture.content == [ImageContent(data="iVBORw0KGgo=", mime_type="image/png")]


async def test_unknown_tool_names_the_real_ones_and_the_session_goes_on(toolbox_url: str) -> None:
    async with client(toolbox_url) as env:
        await env.reset()
        with pytest.raises(UnknownToolError, match="did you mean 'shout'") as unknown:
            await env.call_tool("shuot", text="x")
        assert "add" in unknown.value.tools
        assert (await env.call_tool("add", a=2)).data == 4


@pytest.mark.parametrize(
    ("name", "arguments", "loc"),
    [
        ("add", {"a": "one"}, ["a"]),
        ("add", {}, ["a"]),
        ("add", {"a": 1, "c": 3}, ["c"]),
        ("save", {"body": "no title"}, ["title"]),
    ],
)
async def test_bad_arguments_are_validation_errors_and_the_session_goes_on(
    toolbox_url: str, name: str, arguments: dict[str, object], loc: list[str]
) -> None:
    async with client(toolbox_url) as env:
        await env.reset()
        with pytest.raises(EnvValidationError, match=f"arguments for tool {name!r}") as invalid:
            await env.call_tool(name, arguments)
        assert invalid.value.errors[0]["loc"] == loc
        assert (await env.call_tool("add", a=1, b=1)).data == 2


async def test_failing_tools_are_execution_errors_and_the_session_goes_on(
    toolbox_url: str,
) -> None:
    async with client(toolbox_url) as env:
        await env.reset()
        with pytest.raises(
            EnvExecutionError, match=r"tool 'fail' raised RuntimeError \("
        ) as failed:
            await env.call_tool("fail")
        assert "tool broke" not in str(failed.value)
        with pytest.raises(EnvExecutionError, match="returned a value that cannot be sent"):
            await env.call_tool("unsendable")
        assert (await env.call_tool("shout", text="ok")).text == "OK"


async def test_a_finishing_tool_ends_the_episode_until_reset(toolbox_url: str) -> None:
    async with client(toolbox_url) as env:
        await env.reset(task=Puzzle(id="p", answer=7))
        assert (await env.state()).done is False  # type: ignore[attr-defined]
        result = await env.call_tool("answer", value=7)
        assert (result.text, result.reward, result.finished) == ("right", 1.0, True)
        assert result.metadata == {"expected": 7}
        assert (await env.state()).done is True  # type: ignore[attr-defined]
        with pytest.raises(EpisodeFinishedError, match="the 'answer' tool ended it"):
            await env.call_tool("add", a=1)
        assert len(await env.list_tools()) == len(tools_of(ToolBox))  # still answers
        await env.reset(task=Puzzle(id="p", answer=7))
        assert (await env.state()).done is False  # type: ignore[attr-defined]
        wrong = await env.call_tool("answer", value=1)
    assert (wrong.reward, wrong.finished) == (0.0, True)


def test_the_sync_client_calls_tools(toolbox_url: str) -> None:
    with client(toolbox_url).sync() as env:
        env.reset()
        assert env.call_tool("add", a=40).data == 42
        assert [t.name for t in env.list_tools()][:2] == ["add", "shout"]


@pytest.mark.parametrize(
    ("frame", "reply_type", "code"),
    [
        ({"type": "list_tools", "id": 1}, "tools", None),
        (
            {"type": "call_tool", "data": {"name": "add", "arguments": {"a": 1}}, "id": 2},
            "tool_result",
            None,
        ),
        ({"type": "call_tool", "data": {"name": "add"}, "id": 3}, "error", "VALIDATION_ERROR"),
        ({"type": "call_tool", "data": {"arguments": {}}, "id": 4}, "error", "VALIDATION_ERROR"),
        ({"type": "call_tool", "data": {"name": "nope"}, "id": 5}, "error", "UNKNOWN_TOOL"),
        ({"type": "call_tool", "id": 6}, "error", "VALIDATION_ERROR"),
        ({"type": "list_tool", "id": 7}, "error", "UNKNOWN_TYPE"),
    ],
)
async def test_tool_frames_on_the_wire(
    toolbox_url: str, frame: dict[str, object], reply_type: str, code: str | None
) -> None:
    async with connect(ws_url(toolbox_url)) as ws:
        await exchange(ws, {"type": "reset"})
        reply = await exchange(ws, frame)
        assert (reply["type"], reply["id"]) == (reply_type, frame["id"])
        if code is not None:
            assert reply["data"]["code"] == code  # type: ignore[index]
        after = await exchange(
            ws, {"type": "call_tool", "data": {"name": "add", "arguments": {"a": 0}}}
        )
        assert after["data"]["content"] == [{"type": "json", "data": 2}]  # type: ignore[index]
        assert after["data"]["reward"] is None  # type: ignore[index]


async def test_an_environment_without_tools_is_unchanged_on_the_wire(echo_url: str) -> None:
    async with EchoEnv(echo_url) as env:
        await env.reset()
        assert await env.list_tools() == []
        with pytest.raises(UnknownToolError, match="this environment has no tools"):
            await env.call_tool("anything")
    async with connect(ws_url(echo_url)) as ws:
        await exchange(ws, {"type": "reset"})
        state = await exchange(ws, {"type": "state"})
        assert "done" not in state["data"]  # type: ignore[operator]
