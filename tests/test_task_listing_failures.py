"""An environment whose task listing fails (its factory, ``list_splits`` or
``list_tasks`` raises): ``/splits``, ``/tasks``, OpenReward's routes and
``/envs`` answer with an error naming the call, and the connection stays up; one whose
listing hangs holds up only its own listings."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import httpx
import pytest

from openenv import EnvError
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.server.multi import EnvSpec, create_multi_app
from openenv.testing import run_server


class Ask(Action):
    answer: str = ""


class Question(Observation):
    text: str = ""


class Flaky(Environment[Ask, Question, State]):
    """OpenEnv's instance-method task API, failing where ``breaks`` says."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, breaks: str = "", error: type[Exception] = RuntimeError) -> None:
        super().__init__()
        if breaks == "factory":
            raise error("the dataset at postgres://admin:hunter2@db is gone")
        self.breaks = breaks
        self.error = error

    def list_splits(self) -> list[Any]:
        if self.breaks == "list_splits":
            raise self.error("the dataset at postgres://admin:hunter2@db is gone")
        return ["train"]

    def list_tasks(self, split: str) -> list[Any]:
        if self.breaks == "list_tasks":
            raise self.error("the dataset at postgres://admin:hunter2@db is gone")
        return [{"question": "1+1"}]

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> Question:
        return Question()

    def step(self, action: Ask, timeout_s: float | None = None, **kwargs: Any) -> Question:
        return Question(done=True)

    @property
    def state(self) -> State:
        return State()


def flaky_app(breaks: str, **settings: Any) -> Any:
    return create_app(
        functools.partial(Flaky, breaks, settings.pop("error", RuntimeError)),
        Ask,
        Question,
        env_name="flaky",
        max_concurrent_envs=2,
        **settings,
    )


@pytest.mark.parametrize(
    ("breaks", "call"),
    [
        ("factory", "list_splits()"),
        ("list_splits", "list_splits()"),
        ("list_tasks", "list_tasks('train')"),
    ],
)
def test_a_failing_task_listing_is_a_500_naming_the_call_on_a_connection_that_stays_up(
    breaks: str, call: str
) -> None:
    with run_server(flaky_app(breaks)) as url, httpx.Client(base_url=url) as http:
        for _ in range(2):  # the same connection, asked again
            answer = http.get("/tasks", params={"split": "train"})
            assert answer.status_code == 500
            detail = answer.json()["detail"]
            assert call in detail
            assert "RuntimeError" in detail
            assert "hunter2" not in detail  # not an EnvError: its message stays in the log
        assert http.get("/health").status_code == 200


def test_an_env_error_or_error_details_let_the_message_through() -> None:
    with run_server(flaky_app("list_tasks", error=EnvError)) as url:
        answer = httpx.get(f"{url}/tasks", params={"split": "train"})
        assert answer.status_code == 500
        assert "EnvError: the dataset at" in answer.json()["detail"]
    with run_server(flaky_app("list_splits", error_details=True)) as url:
        answer = httpx.get(f"{url}/splits")
        assert answer.status_code == 500
        assert "RuntimeError: the dataset at" in answer.json()["detail"]


def test_openrewards_task_routes_say_which_call_failed() -> None:
    with run_server(flaky_app("list_tasks")) as url, httpx.Client(base_url=url) as http:
        assert http.get("/flaky/splits").json() == [{"name": "train", "type": "train"}]
        for op, body in [("tasks", {}), ("num_tasks", {}), ("task", {"index": 0})]:
            answer = http.post(f"/flaky/{op}", json={"split": "train", **body})
            assert answer.status_code == 500, op
            assert "list_tasks('train') raised RuntimeError" in answer.json()["detail"]


def test_one_environment_failing_to_list_its_splits_does_not_hide_the_others() -> None:
    def spec(breaks: str) -> EnvSpec:
        return EnvSpec(functools.partial(Flaky, breaks), Ask, Question)

    app = create_multi_app({"broken": spec("list_splits"), "fine": spec("")})
    with run_server(app) as url:
        answer = httpx.get(f"{url}/envs")
        assert answer.status_code == 200, answer.text
        splits = {env["name"]: env["splits"] for env in answer.json()["envs"]}
        assert splits == {"broken": [], "fine": ["train"]}
        assert httpx.get(f"{url}/envs/broken/splits").status_code == 500


class Stuck(Flaky):
    """Its split listing hangs (a dataset on a dead network share) until ``gate`` opens."""

    gate = threading.Event()
    entered: list[int] = []

    def list_splits(self) -> list[Any]:
        Stuck.entered.append(1)
        Stuck.gate.wait(60)
        return ["train"]


async def test_an_environment_whose_listing_hangs_holds_up_only_its_own() -> None:
    # Each request for the stuck environment's splits held one of anyio's 40
    # shared worker threads: past 40, no environment could list its splits.
    app = create_multi_app(
        {"stuck": EnvSpec(Stuck, Ask, Question), "fine": EnvSpec(Flaky, Ask, Question)}
    )
    arrived: list[str] = []

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            arrived.append(scope["path"])
        await app(scope, receive, send)

    with run_server(counting) as url:
        limits = httpx.Limits(max_connections=None)
        async with httpx.AsyncClient(base_url=url, timeout=90, limits=limits) as http:
            stuck = [asyncio.ensure_future(http.get("/envs/stuck/splits")) for _ in range(60)]
            try:
                deadline = asyncio.get_running_loop().time() + 30
                while len(arrived) < len(stuck) or not Stuck.entered:
                    assert asyncio.get_running_loop().time() < deadline, len(arrived)
                    await asyncio.sleep(0.01)
                answer = await asyncio.wait_for(http.get("/envs/fine/splits"), 20)
                assert answer.json() == {"splits": ["train"]}
            finally:
                Stuck.gate.set()
                answers = await asyncio.gather(*stuck)
        assert {a.status_code for a in answers} == {200}
