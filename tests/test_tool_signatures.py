"""Tools declared every way Python allows: each is refused at once with the fix, or
is called with its arguments and its result reaches /ws, v2, MCP and OpenReward alike."""

from __future__ import annotations

import asyncio
import gc
import json
import re
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from mcp import Client
from pydantic import BaseModel
from servers import Ping, Pong

from openenv import (
    ConcurrencyConfig,
    Environment,
    MuxClient,
    State,
    TaskSpec,
    ToolOutput,
    WebSocketEnvClient,
    create_app,
    tool,
)
from openenv.testing import run_server
from openenv.tools import tools_of


class Item(BaseModel):
    name: str
    count: int = 1


class Shelf(Environment[Ping, Pong, State]):
    """Tools whose parameters and results are not just flat JSON."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self.items: list[Item] = []

    @classmethod
    def list_splits(cls) -> Sequence[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> Sequence[TaskSpec]:
        return [TaskSpec(id="t0")]

    def reset(self, **kwargs: Any) -> Pong:
        self.items = []
        return Pong()

    def step(self, action: Ping) -> Pong:
        return Pong(message=action.message)

    @property
    def state(self) -> State:
        return State()

    @tool
    def put(self, item: Item, times: int = 1, /) -> int:
        """Put an item on the shelf ``times`` times (positional-only parameters)."""
        self.items.extend([item] * times)
        return len(self.items)

    @tool
    def stock(self, items: list[Item]) -> int:
        """Put several items on the shelf."""
        self.items.extend(items)
        return len(self.items)

    @tool
    def shelf(self) -> ToolOutput:
        """The items on the shelf, as models, and their names as a set."""
        value = {"items": self.items, "names": {i.name for i in self.items}}
        return ToolOutput.wrap(value).model_copy(update={"reward": 1.0, "finished": True})


EXPECTED = {"items": [{"name": "apple", "count": 2}] * 2, "names": ["apple"]}


def shelf_app() -> Any:
    return create_app(Shelf, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4), mcp=True)


async def test_positional_only_parameters_and_models_in_a_result_over_websockets() -> None:
    with run_server(shelf_app()) as url:
        async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
            await env.reset()
            assert (await env.call_tool("put", {"item": {"name": "apple", "count": 2}})).data == 1
            assert (await env.call_tool("put", item=Item(name="apple", count=2))).data == 2
            result = await env.call_tool("shelf")
            assert (result.data, result.reward, result.finished) == (EXPECTED, 1.0, True)


async def test_models_inside_tool_arguments_are_sent_by_every_client() -> None:
    with run_server(shelf_app()) as url:
        async with WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong) as env:
            await env.reset()
            assert (await env.call_tool("stock", items=[Item(name="pear")])).data == 1
            assert (await env.call_tool("stock", {"items": (Item(name="fig"),)})).data == 2
        async with MuxClient(url, action_cls=Ping, observation_cls=Pong) as mux:
            (session,) = await mux.open(1)
            assert (await session.call_tool("stock", items=[Item(name="pear")])).data == 1


async def test_models_in_a_tool_result_reach_mcp_and_openreward_as_on_websockets() -> None:
    with run_server(shelf_app()) as url:
        async with Client(f"{url}/mcp") as mcp:
            await mcp.call_tool("stock", {"items": [{"name": "apple", "count": 2}] * 2})
            result = await mcp.call_tool("shelf", {})
            assert not result.is_error, result.content
            assert result.structured_content == {"reward": 1.0, "finished": True, "data": EXPECTED}
        async with httpx.AsyncClient(base_url=url) as http:
            opened = (await http.post("/create_session")).text
            sid = re.search(r"event: task_id\r?\ndata: (\w+)", opened).group(1)  # type: ignore[union-attr]
            headers = {"X-Session-ID": sid}
            task = {"split": "train", "index": 0}
            assert (await http.post("/create", json=task, headers=headers)).status_code == 200
            items = {"items": [{"name": "apple", "count": 2}] * 2}
            await http.post("/call", json={"name": "stock", "input": items}, headers=headers)
            stream = await http.post("/call", json={"name": "shelf", "input": {}}, headers=headers)
            end = re.search(r"event: end\r?\ndata: (.*)\r?\n", stream.text)
            assert end is not None, stream.text
            output = json.loads(end.group(1))["output"]
            assert json.loads(output["blocks"][0]["text"]) == EXPECTED
            assert (output["reward"], output["finished"]) == (1.0, True)
            await http.post("/delete", headers=headers)


def test_generator_methods_are_refused_as_tools() -> None:
    with pytest.raises(TypeError, match=r"cannot mark .*numbers, a generator: return a value"):

        class Counting(Environment):  # type: ignore[type-arg]
            @tool
            def numbers(self, n: int) -> Any:
                yield from range(n)

    with pytest.raises(TypeError, match=r"cannot mark .*ticks, a generator"):

        class Ticking(Environment):  # type: ignore[type-arg]
            @tool
            async def ticks(self) -> Any:
                yield 1


@pytest.mark.parametrize(
    ("parameter", "message"),
    [
        ("_secret", "Fields must not use names with leading underscores"),
        ("model_config", "rename parameter 'model_config'"),
    ],
)
def test_parameter_names_pydantic_cannot_take_are_refused_with_a_type_error(
    parameter: str, message: str
) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def go(self, {parameter}: int = 0) -> int:\n    return 1", namespace)
    env_cls = type("Env", (Environment,), {"go": tool(namespace["go"])})
    with pytest.raises(TypeError, match=rf"tool Env.go: .*{message}"):
        tools_of(env_cls)


async def test_an_action_that_cannot_be_encoded_leaves_no_reply_waited_for() -> None:
    """The v2 client raises at once and forgets the request: no future waits for a
    reply that never comes, to be failed (and logged as never retrieved) at close."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    try:
        with run_server(shelf_app()) as url:
            async with MuxClient(url, action_cls=Ping, observation_cls=Pong) as mux:
                (session,) = await mux.open(1)
                with pytest.raises(TypeError, match="not JSON serializable"):
                    await session.step({"message": object()})
                assert (await session.step(Ping(message="hi"))).observation.message == "hi"
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert unhandled == []
