"""Splits and tasks over HTTP and through the client; tasks reach reset() typed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest
from servers import Ping, PingEnvironment, Pong
from tool_envs import HTTP, SPLITS, Puzzle, ToolBox

from openenv import (
    ConcurrencyConfig,
    EnvExecutionError,
    EnvValidationError,
    NotFoundError,
    RemoteEnv,
    SyncRemoteEnv,
    TaskSpec,
    create_app,
)
from openenv.testing import run_server


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = create_app(ToolBox, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        yield url


def test_splits_are_listed(url: str) -> None:
    assert HTTP.get(f"{url}/splits").json() == {"splits": ["train", "test"]}


def test_tasks_come_in_pages(url: str) -> None:
    first = HTTP.get(f"{url}/tasks", params={"split": "train", "limit": 10}).json()
    assert first["total"] == 25
    assert [t["id"] for t in first["tasks"]] == [f"p{i}" for i in range(10)]
    assert first["tasks"][3] == {"id": "p3", "answer": 3, "prompt": "say 3"}
    assert first["next_offset"] == 10
    last = HTTP.get(f"{url}/tasks", params={"split": "train", "offset": 20, "limit": 10}).json()
    assert [t["id"] for t in last["tasks"]] == [f"p{i}" for i in range(20, 25)]
    assert last["next_offset"] is None
    beyond = HTTP.get(f"{url}/tasks", params={"split": "train", "offset": 99}).json()
    assert (beyond["tasks"], beyond["next_offset"]) == ([], None)
    default = HTTP.get(f"{url}/tasks", params={"split": "test"}).json()
    assert (default["limit"], default["total"]) == (100, 1)


def test_unknown_split_is_a_404_that_names_the_real_ones(url: str) -> None:
    response = HTTP.get(f"{url}/tasks", params={"split": "tset"})
    assert response.status_code == 404
    assert response.json()["detail"] == (
        "unknown split 'tset'; this environment has: train, test; did you mean 'test'?"
    )


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"split": "train", "offset": -1}, "offset"),
        ({"split": "train", "limit": 0}, "limit"),
        ({"split": "train", "limit": 1001}, "limit"),
        ({"split": "train", "limit": "ten"}, "limit"),
        ({}, "split"),
    ],
)
def test_bad_paging_is_a_422_naming_the_parameter(
    url: str, params: dict[str, object], field: str
) -> None:
    response = HTTP.get(f"{url}/tasks", params=params)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", field]


def test_an_environment_without_tasks_has_no_splits() -> None:
    with run_server(create_app(PingEnvironment, Ping, Pong)) as url:
        assert HTTP.get(f"{url}/splits").json() == {"splits": []}
        response = HTTP.get(f"{url}/tasks", params={"split": "train"})
    assert response.status_code == 404
    assert "no task splits" in response.json()["detail"]


async def test_the_client_pages_through_a_split(url: str) -> None:
    env = RemoteEnv(url)
    assert await env.list_splits() == ["train", "test"]
    everything = await env.list_tasks("train")
    assert [t.id for t in everything] == [t.id for t in SPLITS["train"]]
    assert everything[4].answer == 4  # type: ignore[attr-defined]  # extra fields are kept
    typed = await RemoteEnv(url, task_cls=Puzzle).list_tasks("test")
    assert typed == [Puzzle(id="q0", answer=42, prompt="say 42")]
    window = await env.list_tasks("train", offset=23, limit=5)
    assert [t.id for t in window] == ["p23", "p24"]
    assert await env.list_tasks("train", limit=0) == []
    with pytest.raises(NotFoundError, match="did you mean 'train'") as missing:
        await env.list_tasks("trian")
    assert missing.value.status_code == 404
    with pytest.raises(ValueError, match="must not be negative"):
        await env.list_tasks("train", offset=-1)


async def test_a_task_reaches_reset_as_the_environment_s_own_class(url: str) -> None:
    env = RemoteEnv(url)
    task = (await env.list_tasks("test"))[0]
    async with env.session(task) as session:
        assert session.first is not None
        assert session.first.observation.message == "task:q0:Puzzle"  # type: ignore[attr-defined]
        assert await session.get_prompt() == "say 42"
        result = await session.call_tool("answer", value=42)
        assert (result.reward, session.total_reward, session.steps, session.done) == (
            1.0,
            1.0,
            1,
            True,
        )


async def test_a_task_that_does_not_fit_is_a_validation_error(url: str) -> None:
    async with RemoteEnv(url).session() as session:
        with pytest.raises(EnvValidationError, match="invalid task: answer: Field required"):
            await session.reset(task=TaskSpec(id="x"))
        # the session goes on, and still has no task to prompt for
        with pytest.raises(EnvValidationError, match="no task to give a prompt for"):
            await session.get_prompt()


async def test_get_prompt_without_a_prompt_is_an_execution_error(url: str) -> None:
    async with RemoteEnv(url).session(Puzzle(id="np", answer=1, prompt="x")) as session:
        assert await session.get_prompt() == "x"
        assert await session.client.get_prompt(Puzzle(id="other", answer=2, prompt="y")) == "y"
    with run_server(create_app(PingEnvironment, Ping, Pong)) as other:
        async with RemoteEnv(other).session() as session:
            with pytest.raises(EnvExecutionError, match="NotImplementedError"):
                await session.client.get_prompt(TaskSpec(id="t"))


def test_the_sync_remote_env(url: str) -> None:
    env = SyncRemoteEnv(url)
    assert env.list_splits() == ["train", "test"]
    tasks = env.list_tasks("train", limit=3)
    with env.session(tasks[2]) as session:
        assert session.get_prompt() == "say 2"
        assert session.call_tool("answer", value=2).reward == 1.0
        assert session.state().done is True  # type: ignore[attr-defined]


class SlowCatalog(PingEnvironment):
    """Its splits come from somewhere slow (a dataset on a network disk)."""

    asked = threading.Event()
    go_on = threading.Event()

    @classmethod
    def list_splits(cls) -> list[str]:
        cls.asked.set()
        # Told to go on only once a step has been answered meanwhile.
        return ["train"] if cls.go_on.wait(30) else ["the loop was blocked"]

    @classmethod
    def list_tasks(cls, split: str) -> list[TaskSpec]:
        return [TaskSpec(id="t0")]


async def test_a_slow_split_listing_does_not_hold_up_the_sessions_steps() -> None:
    app = create_app(SlowCatalog, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=2))
    with run_server(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            listing = asyncio.ensure_future(http.get("/splits"))
            assert await asyncio.to_thread(SlowCatalog.asked.wait, 30)
            async with RemoteEnv(url).session() as session:
                result = await session.step(Ping(message="meanwhile"))
            assert result.observation.message == "meanwhile"  # type: ignore[attr-defined]
            SlowCatalog.go_on.set()
            assert (await listing).json() == {"splits": ["train"]}
