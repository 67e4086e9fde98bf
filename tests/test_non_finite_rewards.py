"""A NaN or infinite reward reaches the trainer as that float, on every path.

JSON has no number for NaN or infinity, and orjson writes ``null`` for them,
so a NaN reward used to arrive as no reward at all (``None``, counted as 0).
Frames now carry them as the text ``"NaN"``, ``"Infinity"`` or
``"-Infinity"`` (pydantic's spelling), read back to floats by the clients,
Runners' results, ``openenv report`` and the recorded trajectories.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import gymnasium
import httpx
import numpy as np
import orjson
import pytest
from playwright.async_api import Page, expect
from web_page_kit import idle
from websockets.asyncio.client import connect

from openenv import (
    Action,
    ConcurrencyConfig,
    Environment,
    MuxClient,
    Observation,
    RunConfig,
    Runners,
    State,
    Task,
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
from openenv.cli.run import write_results
from openenv.client import ws_url
from openenv.report import load_results, render_report
from openenv.runtime import EpisodeSession
from openenv.testing import run_server
from openenv.trajectories import load

Kind = Literal["nan", "inf", "-inf", "half"]
REWARDS: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "half": 0.5}


class Pick(Action):
    reward: Kind = "half"


class Picked(Observation):
    seen: float = 0.0  # a finite field beside the reward


class Rewarding(Environment[Pick, Picked, State]):
    """Returns the reward the action names; its tool does the same."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Picked:
        return Picked(reward=math.nan)

    def step(self, action: Pick, **kwargs: Any) -> Picked:
        self._state.step_count += 1
        return Picked(seen=1.0, reward=REWARDS[action.reward])

    @tool
    def score(self, reward: Kind) -> ToolOutput:
        """Answer with the named reward."""
        return ToolOutput(reward=REWARDS[reward])

    @property
    def state(self) -> State:
        return self._state


def same(a: float | None, b: float) -> bool:
    return a is not None and (a == b or (math.isnan(a) and math.isnan(b)))


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rec")


@pytest.fixture(scope="module")
def url(record: Path) -> Iterator[str]:
    app = create_app(
        Rewarding, Pick, Picked, ConcurrencyConfig(max_concurrent_envs=16), record=str(record)
    )
    with run_server(app) as url:
        yield url


def client(url: str) -> WebSocketEnvClient[Pick, Picked, State]:
    return WebSocketEnvClient(url, action_cls=Pick, observation_cls=Picked)


@pytest.mark.parametrize("kind", ["nan", "inf", "-inf", "half"])
async def test_a_v1_step_returns_the_reward_it_was_given(url: str, kind: Kind) -> None:
    async with client(url) as env:
        assert math.isnan((await env.reset()).reward or 0.0)
        result = await env.step(Pick(reward=kind))
    assert same(result.reward, REWARDS[kind])
    assert same(result.observation.reward, REWARDS[kind])
    assert result.observation.seen == 1.0


async def test_a_v2_batch_returns_each_sessions_reward(url: str) -> None:
    kinds: list[Kind] = ["nan", "inf", "-inf", "half"]
    async with MuxClient(url, action_cls=Pick, observation_cls=Picked) as mux:
        sessions = await mux.open(len(kinds))
        assert all(math.isnan(r.reward or 0.0) for r in await mux.reset(sessions))
        results = await mux.step(sessions, [Pick(reward=k) for k in kinds])
    assert [same(r.reward, REWARDS[k]) for r, k in zip(results, kinds, strict=True)] == [True] * 4


def test_openenvs_http_calls_write_the_reward_as_text(url: str) -> None:
    reset = orjson.loads(httpx.post(f"{url}/reset", json={}).content)  # strict JSON
    step = orjson.loads(httpx.post(f"{url}/step", json={"action": {"reward": "inf"}}).content)
    assert (reset["reward"], step["reward"]) == ("NaN", "Infinity")
    assert step["observation"]["seen"] == 1.0


async def test_the_frame_is_json_with_the_reward_as_text(url: str) -> None:
    async with connect(ws_url(url)) as ws:
        await ws.send('{"type":"reset"}')
        reset = orjson.loads(await ws.recv())  # strict JSON: no NaN token
        await ws.send('{"type":"step","data":{"reward":"-inf"}}')
        step = orjson.loads(await ws.recv())
    assert reset["data"]["reward"] == "NaN"
    assert step["data"]["reward"] == "-Infinity"
    assert step["data"]["observation"] == {"seen": 1.0}


async def test_a_tool_call_returns_the_reward_it_was_given(url: str) -> None:
    async with client(url) as env:
        await env.reset()
        outputs = [await env.call_tool("score", reward=k) for k in ("nan", "inf", "half")]
    assert [o.reward for o in outputs[1:]] == [math.inf, 0.5]
    assert math.isnan(outputs[0].reward or 0.0)


async def nan_then_half(session: EpisodeSession) -> None:
    await session.reset()
    await session.step(Pick(reward="half"))
    if session.task.id.startswith("bad"):
        await session.step(Pick(reward="nan"))


def test_runners_results_and_the_report_keep_a_nan_total(url: str, tmp_path: Path) -> None:
    ids = [f"{name}-{n}" for name in ("good", "bad") for n in range(2)]
    tasks = [Task(id=i, env=url, agent=nan_then_half) for i in ids]
    results = Runners.sync_run_task(tasks, RunConfig(max_concurrency=4, retries=0))
    totals = {r.task_id: r.reward for r in results}
    assert totals["good-0"] == 0.5
    assert math.isnan(totals["bad-0"])
    path = tmp_path / "results.jsonl"
    write_results(results, path)
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert sorted(line["reward"] for line in lines if line["task_id"].startswith("bad")) == [
        "NaN",
        "NaN",
    ]
    rows = load_results(path)
    assert sum(math.isnan(row["reward"]) for row in rows) == 2
    page = render_report(rows)
    assert "rewards NaN or infinite" in page
    assert "<b>0.500</b><span>mean reward</span>" in page  # over the finite ones


def test_a_recorded_nan_reward_reads_back_as_nan(url: str, record: Path) -> None:
    async def play() -> None:
        async with client(url) as env:
            await env.reset()
            await env.step(Pick(reward="inf"))

    asyncio.run(play())
    steps = [s for e in load(record) for s in e.steps if s.kind == "step"]
    assert any(s.reward == math.inf for s in steps)
    assert all(s.reward is not None for s in steps)


@pytest.mark.asyncio(loop_scope="session")  # the shared browser's loop
async def test_the_web_page_shows_them(url: str, new_page: Callable[..., Awaitable[Page]]) -> None:
    page = await new_page(url)
    await page.get_by_role("button", name="Reset").click()
    await idle(page)
    await expect(page.locator("#reward")).to_have_text("NaN")
    for kind, reward, total in (("-inf", "-Infinity", "-Infinity"), ("half", "0.5", "-Infinity")):
        await page.locator("#action-reward").select_option(kind)
        await page.get_by_role("button", name="Step").click()
        await idle(page)
        await expect(page.locator("#reward")).to_have_text(reward)
        await expect(page.locator("#total-reward")).to_have_text(total)
    await expect(page.locator("#history tbody tr:not(.detail) td").nth(1)).to_have_text("-Infinity")


class Odd(gymnasium.Env[np.ndarray, np.int64]):
    """Action i earns ODD_REWARDS[i]."""

    action_space = gymnasium.spaces.Discrete(4)
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.int64) -> Any:
        return np.zeros(1, np.float32), ODD_REWARDS[int(action)], False, False, {}


ODD_REWARDS = [math.nan, math.inf, -math.inf, 0.5]


@pytest.mark.parametrize("serve", [create_gymnasium_app, create_gymnasium_vector_app])
def test_a_remote_vector_env_returns_them_in_its_rewards(serve: Callable[..., Any]) -> None:
    with run_server(serve(Odd, ConcurrencyConfig(max_concurrent_envs=4))) as url:
        envs = RemoteVectorEnv(url, num_envs=4)
        try:
            envs.reset(seed=0)
            _, rewards, *_ = envs.step(np.arange(4))
        finally:
            envs.close()
    np.testing.assert_array_equal(rewards, ODD_REWARDS)  # NaN equals NaN here
