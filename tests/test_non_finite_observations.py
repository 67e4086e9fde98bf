"""NaN and ±inf in an observation's own fields reach a typed client as those floats.

JSON has no numbers for them, and orjson writes ``null``: an observation with a
NaN ``float`` field used to reach a typed client as ``null``, which its model
refused (a ``ValidationError`` out of ``step``), and an action with one was
refused by the server. Frames now write them as the text ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` (pydantic's ``ser_json_inf_nan="strings"``),
as they already wrote rewards, nested models and lists included; a frame
stays strict JSON.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import httpx
import numpy as np
import orjson
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from mcp import Client as MCPClient
from pydantic import BaseModel, field_serializer
from websockets.asyncio.client import connect

from openenv import (
    Action,
    ConcurrencyConfig,
    Environment,
    MuxClient,
    Observation,
    State,
    ToolOutput,
    WebSocketEnvClient,
    create_app,
    tool,
)
from openenv.adapters.gymnasium import (
    RemoteVectorEnv,
    create_gymnasium_app,
    create_gymnasium_vector_app,
)
from openenv.client import ws_url
from openenv.testing import run_server

ODD = [math.nan, math.inf, -math.inf]


class Point(BaseModel):
    x: float


class Reading(Observation):
    score: float = 0.0
    trace: list[float] = []
    where: Point = Point(x=0.0)


class Rounded(Reading):
    """Its own serializer on the reward: its replies are written another way."""

    @field_serializer("reward")
    def _rounded(self, reward: float | None) -> float | None:
        return reward if reward is None or not math.isfinite(reward) else round(reward, 1)


class Ask(Action):
    value: float = 0.0
    note: bool = False  # put the value in the metadata too


def make_env(observation_cls: type[Reading]) -> type[Environment[Ask, Reading, State]]:
    class Odd(Environment[Ask, Reading, State]):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            self._state = State()

        def reset(
            self, seed: int | None = None, episode_id: str | None = None, **kw: Any
        ) -> Reading:
            return observation_cls(score=math.nan)

        def step(self, action: Ask, **kwargs: Any) -> Reading:
            value = action.value
            return observation_cls(
                score=value,
                trace=[1.0, value, -value],
                where=Point(x=value),
                reward=0.44,
                metadata={"value": value} if action.note else {},
            )

        @property
        def state(self) -> State:
            return self._state

    return Odd


def serve(observation_cls: type[Reading]) -> Iterator[str]:
    app = create_app(
        make_env(observation_cls), Ask, observation_cls, ConcurrencyConfig(max_concurrent_envs=8)
    )
    with run_server(app) as url:
        yield url


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from serve(Reading)


@pytest.fixture(scope="module")
def rounded_url() -> Iterator[str]:
    yield from serve(Rounded)


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def holds(observation: Reading, value: float) -> bool:
    return (
        same(observation.score, value)
        and all(map(same, observation.trace, [1.0, value, -value]))
        and same(observation.where.x, value)
    )


@pytest.mark.parametrize("value", ODD)
async def test_a_typed_client_gets_the_floats_back(url: str, value: float) -> None:
    async with WebSocketEnvClient(url, action_cls=Ask, observation_cls=Reading) as env:
        assert math.isnan((await env.reset()).observation.score)
        result = await env.step(Ask(value=value))
    assert holds(result.observation, value)
    assert result.reward == 0.44


async def test_a_v2_batch_gets_each_sessions_floats_back(url: str) -> None:
    async with MuxClient(url, action_cls=Ask, observation_cls=Reading) as mux:
        sessions = await mux.open(len(ODD) + 1)
        await mux.reset(sessions)
        results = await mux.step(sessions, [Ask(value=v) for v in [*ODD, 2.5]])
    assert [holds(r.observation, v) for r, v in zip(results, [*ODD, 2.5], strict=True)] == [
        True
    ] * 4


async def test_the_frame_is_strict_json_with_the_floats_as_text(url: str) -> None:
    async with connect(ws_url(url)) as ws:
        await ws.send('{"type":"reset"}')
        reset = orjson.loads(await ws.recv())  # strict JSON: no NaN token
        await ws.send(orjson.dumps({"type": "step", "data": {"value": "-Infinity", "note": True}}))
        step = orjson.loads(await ws.recv())
    assert reset["data"]["observation"]["score"] == "NaN"
    assert step["data"]["observation"] == {
        "score": "-Infinity",
        "trace": [1.0, "-Infinity", "Infinity"],
        "where": {"x": "-Infinity"},
        "metadata": {"value": "-Infinity"},  # among the fields too, as OpenEnv sends it
    }
    assert step["data"]["metadata"] == {"value": "-Infinity"}
    assert (step["data"]["reward"], step["data"]["done"]) == (0.44, False)


def test_openenvs_http_step_writes_them_as_text(url: str) -> None:
    step = orjson.loads(httpx.post(f"{url}/step", json={"action": {"value": "NaN"}}).content)
    assert step["observation"]["trace"] == [1.0, "NaN", "NaN"]


async def test_a_models_own_serializers_still_apply(rounded_url: str) -> None:
    async with connect(ws_url(rounded_url)) as ws:
        await ws.send('{"type":"reset"}')
        await ws.recv()
        await ws.send('{"type":"step","data":{"value":"Infinity"}}')
        step = orjson.loads(await ws.recv())
    assert step["data"]["reward"] == 0.4  # through the model's serializer
    assert step["data"]["observation"]["score"] == "Infinity"
    assert set(step["data"]["observation"]) == {"score", "trace", "where"}


class Diverging(gymnasium.Env[np.ndarray, np.int64]):
    """A simulation that blows up: its Box observations and infos hold ±inf and NaN."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (3,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.array([0.5, np.inf, -np.inf], dtype=np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        seen = np.array([np.nan, -np.inf, 0.25], dtype=np.float32)
        return seen, 1.0, False, False, {"energy": np.inf}


@pytest.mark.parametrize("make_app", [create_gymnasium_app, create_gymnasium_vector_app])
def test_a_remote_vector_env_gets_box_observations_and_infos_as_sync_vector_env(
    make_app: Callable[..., Any],
) -> None:
    here = SyncVectorEnv([Diverging] * 2)
    with run_server(make_app(Diverging, ConcurrencyConfig(max_concurrent_envs=4))) as url:
        remote = RemoteVectorEnv(url, 2)
        try:
            np.testing.assert_array_equal(remote.reset(seed=1)[0], here.reset(seed=1)[0])
            got, _, _, _, infos = remote.step(np.array([0, 1]))
            want, _, _, _, want_infos = here.step(np.array([0, 1]))
        finally:
            remote.close()
            here.close()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # NaN where NaN, each inf with its sign
    np.testing.assert_array_equal(infos["energy"], want_infos["energy"])


class Measuring(Environment[Ask, Reading, State]):
    """Its tool's JSON result holds NaN and ±inf."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Reading:
        return Reading()

    def step(self, action: Ask, **kwargs: Any) -> Reading:
        return Reading()

    @tool
    def measure(self) -> ToolOutput:
        """Measure what cannot be measured."""
        return ToolOutput.wrap({"mean": math.nan, "bounds": [-math.inf, math.inf]})

    @property
    def state(self) -> State:
        return self._state


MEASURED = {"mean": "NaN", "bounds": ["-Infinity", "Infinity"]}


async def test_a_tools_json_result_says_the_same_on_every_surface() -> None:
    app = create_app(Measuring, Ask, Reading, ConcurrencyConfig(max_concurrent_envs=4), mcp=True)
    with run_server(app) as url:
        async with connect(ws_url(url)) as ws:
            await ws.send('{"type":"call_tool","data":{"name":"measure","arguments":{}}}')
            reply = orjson.loads(await ws.recv())  # strict JSON
        assert reply["data"]["content"][0]["data"] == MEASURED
        async with MCPClient(f"{url}/mcp") as mcp:
            result = await mcp.call_tool("measure", {})
        assert result.structured_content is not None
        assert result.structured_content["data"] == MEASURED
        assert orjson.loads(result.content[0].text) == MEASURED  # type: ignore[union-attr]
        async with httpx.AsyncClient(base_url=url) as http:
            opened = (await http.post("/create_session")).text
            found = re.search(r"event: task_id\r?\ndata: (\w+)", opened)
            assert found is not None, opened
            headers = {"X-Session-ID": found.group(1)}
            created = await http.post("/create", json={"task_spec": {"id": "t"}}, headers=headers)
            assert created.status_code == 200, created.text
            body = {"name": "measure", "input": {}}
            stream = (await http.post("/call", json=body, headers=headers)).text
            await http.post("/delete", headers=headers)
        end = re.search(r"event: end\r?\ndata: (.*)\r?\n", stream)
        assert end is not None, stream
        (block,) = orjson.loads(end.group(1))["output"]["blocks"]
        assert orjson.loads(block["text"]) == MEASURED


class Tally(Observation):
    counts: dict[str, float] = {}


class Tallying(Environment[Ask, Tally, State]):
    """Its observation holds a dict shaped like a reply's envelope: a ``reward``
    key, then a ``done`` key, as a reply without a reward writes them."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Tally:
        return Tally()

    def step(self, action: Ask, **kwargs: Any) -> Tally:
        counts = {"reward": action.value, "done": 1.0}
        return Tally(counts=counts, reward=0.5 if action.note else None)

    @property
    def state(self) -> State:
        return State()


@pytest.mark.parametrize("rewarded", [False, True])
async def test_a_nested_reward_key_is_not_taken_for_the_replys_own(rewarded: bool) -> None:
    """A NaN under a ``reward`` key followed by a ``done`` key, inside an observation,
    was written as ``null``: the writer took it for a reply's empty reward."""
    app = create_app(Tallying, Ask, Tally, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        async with WebSocketEnvClient(url, action_cls=Ask, observation_cls=Tally) as env:
            await env.reset()
            result = await env.step(Ask(value=math.nan, note=rewarded))
        async with MuxClient(url, action_cls=Ask, observation_cls=Tally) as mux:
            sessions = await mux.open(2)
            await mux.reset(sessions)
            batch = await mux.step(sessions, [Ask(value=v, note=rewarded) for v in ODD[1:]])
    assert math.isnan(result.observation.counts["reward"])
    assert [r.observation.counts["reward"] for r in batch] == ODD[1:]
    assert [r.reward for r in [result, *batch]] == [0.5 if rewarded else None] * 3
