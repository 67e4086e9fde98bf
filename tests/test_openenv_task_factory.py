"""OpenEnv's task API (instance methods) asked of what the app's factory makes:
an environment whose constructor takes arguments lists the tasks of its data."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import pytest

from openenv import create_app as openenv_create_app
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.testing import run_server


class Ask(Action):
    answer: str = ""


class Question(Observation):
    text: str = ""


made: list[str] = []
closed: list[str] = []


class Quiz(Environment[Ask, Question, State]):
    """Its questions come from the data its constructor is given."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, data: dict[str, list[str]]) -> None:
        super().__init__()
        self.data = data
        made.append("made")

    def list_splits(self) -> list[Any]:
        return list(self.data)

    async def list_tasks(self, split: str) -> list[Any]:
        return [{"question": q} for q in self.data[split]]

    def num_tasks(self, split: str) -> int:
        return len(self.data[split])

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        return {"question": self.data[split][index]}

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> Question:
        return Question(text=self.get_task("train", 0)["question"])

    def step(self, action: Ask, timeout_s: float | None = None, **kwargs: Any) -> Question:
        return Question(done=True)

    @property
    def state(self) -> State:
        return State()

    def close(self) -> None:
        closed.append("closed")


DATA = {"train": ["1+1", "2+2"], "hard": ["e^(i*pi)"]}


def make_quiz() -> Quiz:
    return Quiz(DATA)


FACTORIES = {
    "partial, openenv.core": lambda: create_app(
        functools.partial(Quiz, DATA), Ask, Question, env_name="quiz", max_concurrent_envs=2
    ),
    "annotated function, openenv.core": lambda: create_app(
        make_quiz, Ask, Question, env_name="quiz", max_concurrent_envs=2
    ),
    "partial, openenv": lambda: openenv_create_app(
        functools.partial(Quiz, DATA), Ask, Question, max_concurrent_envs=2, env_name="quiz"
    ),
}


@pytest.mark.parametrize("kind", FACTORIES)
def test_task_routes_ask_an_environment_made_by_the_apps_factory(kind: str) -> None:
    made.clear()
    closed.clear()
    app = FACTORIES[kind]()
    with run_server(app) as url, httpx.Client(base_url=url) as http:
        splits = http.get("/splits")
        assert splits.status_code == 200, splits.text
        assert splits.json()["splits"] == ["train", "hard"]
        page = http.get("/tasks", params={"split": "hard"})
        assert page.status_code == 200, page.text
        assert [task["question"] for task in page.json()["tasks"]] == ["e^(i*pi)"]
        # OpenReward's routes, which OpenEnv's own server serves too.
        named = http.get("/quiz/splits")
        assert named.status_code == 200, named.text
        assert [split["name"] for split in named.json()] == ["train", "hard"]
        tasks = http.post("/quiz/tasks", json={"split": "train"})
        assert tasks.status_code == 200, tasks.text
        assert [task["question"] for task in tasks.json()["tasks"]] == ["1+1", "2+2"]
        count = http.post("/quiz/num_tasks", json={"split": "train"})
        assert count.status_code == 200, count.text
        assert count.json()["num_tasks"] == 2
        task = http.post("/quiz/task", json={"split": "train", "index": 1})
        assert task.status_code == 200, task.text
        assert task.json()["task"]["question"] == "2+2"
    assert len(closed) == len(made) > 0  # every environment made to answer was closed
