"""OpenEnv 0.10 environments and scripts that use more of ``openenv.core`` than
its template: numpy fields, the task API as instance methods, rubrics,
``web_interface`` and ``containers``; each served by openenv's ``create_app``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pydantic
import pytest

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.http_server import create_app
from openenv.testing import run_server

sys.path.insert(0, str(Path(__file__).parent / "apps"))

from oe_echo import OeEchoAction, OeEchoEnv
from oe_echo.server.app import app as oe_echo_app


def test_an_openenv_observation_with_a_numpy_field_reaches_the_client() -> None:
    # As OpenEnv's models: arbitrary field types allowed, assignments validated.
    # Defined here, not at module level: on a server without them the class
    # definition itself fails.
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class Look(Action):
        row: int = 0

    class Frame(Observation):
        pixels: np.ndarray | None = None

    class Board(State):
        grid: np.ndarray | None = None

    class Pixels(Environment[Look, Frame, Board]):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = Board(grid=np.eye(2, dtype=np.int64))

        def reset(self, seed: int | None = None, episode_id: str | None = None) -> Frame:
            return Frame(pixels=np.zeros((2, 2), dtype=np.float32))

        def step(self, action: Look, timeout_s: float | None = None, **kwargs: Any) -> Frame:
            frame = Frame(pixels=np.arange(4, dtype=np.uint8).reshape(2, 2))
            frame.reward = 1  # validated: becomes 1.0
            self._state.step_count += 1
            return frame

        @property
        def state(self) -> Board:
            return self._state

    class PixelsClient(EnvClient[Look, Frame, Board]):
        def _step_payload(self, action: Look) -> dict[str, Any]:
            return action.model_dump()

        def _parse_result(self, payload: dict[str, Any]) -> StepResult[Frame]:
            pixels = np.array(payload["observation"]["pixels"])
            frame = Frame(pixels=pixels, reward=payload.get("reward"), done=payload["done"])
            return StepResult(observation=frame, reward=payload.get("reward"), done=frame.done)

        def _parse_state(self, payload: dict[str, Any]) -> Board:
            return Board(grid=np.array(payload["grid"]), step_count=payload["step_count"])

    frame = Frame()
    with pytest.raises(pydantic.ValidationError):
        frame.done = "maybe"  # type: ignore[assignment]
    app = create_app(Pixels, Look, Frame, env_name="pixels", max_concurrent_envs=2)
    with run_server(app) as url, PixelsClient(base_url=url) as env:
        first = env.reset()
        assert first.observation.pixels is not None
        assert first.observation.pixels.tolist() == [[0.0, 0.0], [0.0, 0.0]]
        result = env.step(Look(row=1))
        assert result.observation.pixels is not None
        assert result.observation.pixels.tolist() == [[0, 1], [2, 3]]
        assert result.reward == 1.0
        state = env.state()
        assert state.grid is not None
        assert state.grid.tolist() == [[1, 0], [0, 1]]
        assert state.step_count == 1


def test_trls_scripts_import_the_docker_provider_and_run_without_it() -> None:
    # TRL's catch.py and sudoku.py import it at the top, and use it only for
    # --env-mode docker-image; their other modes connect to a running server.
    from openenv.core.containers.runtime import ContainerProvider, LocalDockerProvider

    with run_server(oe_echo_app) as url, OeEchoEnv(base_url=url) as env:
        env.reset()
        assert env.step(OeEchoAction(message="hi")).observation.echoed_message == "hi"
    with pytest.raises(RuntimeError, match=r"does not start containers.*docker run"):
        LocalDockerProvider()
    assert issubclass(LocalDockerProvider, ContainerProvider)


def test_openenvs_task_api_as_instance_methods_is_served() -> None:
    # OpenEnv 0.10's TaskProvider: instance methods, sync or async, answering
    # dicts; its server calls them on a fresh environment, closed after.
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class Ask(Action):
        answer: str = ""

    class Question(Observation):
        text: str = ""

    made: list[str] = []
    closed: list[str] = []
    questions = {"train": ["1+1", "2+2"], "test": ["3+3"]}

    class Quiz(Environment[Ask, Question, State]):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            made.append("made")

        def list_splits(self) -> list[Any]:
            return ["train", {"name": "test", "type": "test"}]

        async def list_tasks(self, split: str) -> list[Any]:
            return [{"question": q} for q in questions[split]]

        def get_task(self, split: str, index: int) -> dict[str, Any]:
            return {"question": questions[split][index]}

        def reset(
            self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
        ) -> Question:
            # The environment's own call, on itself, as written.
            return Question(text=self.get_task("train", 1)["question"])

        def step(self, action: Ask, timeout_s: float | None = None, **kwargs: Any) -> Question:
            return Question(done=True)

        @property
        def state(self) -> State:
            return State()

        def close(self) -> None:
            closed.append("closed")

    class QuizClient(EnvClient[Ask, Question, State]):
        def _step_payload(self, action: Ask) -> dict[str, Any]:
            return action.model_dump()

        def _parse_result(self, payload: dict[str, Any]) -> StepResult[Question]:
            question = Question(**payload["observation"])
            return StepResult(observation=question, reward=payload.get("reward"), done=False)

        def _parse_state(self, payload: dict[str, Any]) -> State:
            return State(**payload)

    app = create_app(Quiz, Ask, Question, env_name="quiz", max_concurrent_envs=2)
    with run_server(app) as url, httpx.Client(base_url=url) as http:
        splits = http.get("/splits")
        assert splits.status_code == 200, splits.text
        assert splits.json()["splits"] == ["train", "test"]
        page = http.get("/tasks", params={"split": "train"}).json()
        assert [task["question"] for task in page["tasks"]] == ["1+1", "2+2"]
        assert page["tasks"][0]["id"] == "train-0"
        # OpenReward's routes, which OpenEnv 0.10's own server serves too.
        named = http.get("/quiz/splits")
        assert named.status_code == 200, named.text
        assert "test" in named.text
        tasks = http.post("/quiz/tasks", json={"split": "test"})
        assert tasks.status_code == 200, tasks.text
        assert [task["question"] for task in tasks.json()["tasks"]] == ["3+3"]
        assert len(closed) == len(made) > 0  # every environment made to answer was closed
        with QuizClient(base_url=url) as env:
            assert env.reset().observation.text == "2+2"


def test_an_openenv_environment_scored_by_openenvs_rubrics() -> None:
    # As chess_env, carla_env and repl_env write them: rubrics imported from
    # openenv.core.rubrics, given to Environment(rubric=...), applied per step.
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from openenv.core.rubrics.base import Rubric
    from openenv.core.rubrics.trajectory import ExponentialDiscountingTrajectoryRubric

    class Move(Action):
        word: str = ""

    class Board(Observation):
        moves: int = 0

    class Said(Rubric):  # repl_env's shape: the expected answer set at reset
        def __init__(self) -> None:
            super().__init__()
            self.expected: str | None = None

        def forward(self, action: Any, observation: Any) -> float:
            return 1.0 if action.word == self.expected else 0.0

    class WinLoss(ExponentialDiscountingTrajectoryRubric):
        def __init__(self) -> None:
            super().__init__(gamma=0.5)
            self.said = Said()

        def score_trajectory(self, trajectory: list[tuple[Any, Any]]) -> float:
            return self.said(*trajectory[-1])

    class Game(Environment[Move, Board, State]):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__(rubric=WinLoss())
            self._state = State()

        def reset(self, seed: int | None = None, episode_id: str | None = None) -> Board:
            self._reset_rubric()
            self.rubric.said.expected = "mate"
            self._state = State(episode_id=episode_id)
            return Board()

        def step(self, action: Move, timeout_s: float | None = None, **kwargs: Any) -> Board:
            self._state.step_count += 1
            board = Board(moves=self._state.step_count, done=self._state.step_count == 3)
            board.reward = self._apply_rubric(action, board)
            if board.done:
                board.metadata["step_rewards"] = self.rubric.compute_step_rewards()
            return board

        @property
        def state(self) -> State:
            return self._state

    class GameClient(EnvClient[Move, Board, State]):
        def _step_payload(self, action: Move) -> dict[str, Any]:
            return action.model_dump()

        def _parse_result(self, payload: dict[str, Any]) -> StepResult[Board]:
            board = Board(**payload["observation"], done=payload["done"])
            return StepResult(observation=board, reward=payload.get("reward"), done=board.done)

        def _parse_state(self, payload: dict[str, Any]) -> State:
            return State(**payload)

    app = create_app(Game, Move, Board, env_name="game", max_concurrent_envs=2)
    with run_server(app) as url, GameClient(base_url=url) as env:
        for _ in range(2):  # the rubric starts afresh with each episode
            env.reset()
            rewards = [env.step(Move(word=word)).reward for word in ("e4", "Qh5", "mate")]
            assert rewards == [0.0, 0.0, 1.0]
        env.reset()
        assert [env.step(Move(word="pass")).reward for _ in range(3)] == [0.0, 0.0, 0.0]
        env.reset()
        results = [env.step(Move(word=word)) for word in ("e4", "Qh5", "mate")]
        assert results[-1].observation.metadata["step_rewards"] == [0.25, 0.5, 1.0]


def test_wildfire_style_app_replaces_the_web_page_with_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # wildfire_env's app.py: metadata from web_interface, its own GET /web in
    # place of the server's.
    from fastapi.responses import HTMLResponse

    from openenv.core.env_server.web_interface import load_environment_metadata

    readme = tmp_path / "README.md"
    readme.write_text("# Fire\nPut it out.\n", encoding="utf-8")
    monkeypatch.setenv("ENV_README_PATH", str(readme))

    def make_fire() -> Any:
        from oe_echo.server.oe_echo_environment import OeEchoEnvironment

        return OeEchoEnvironment()

    from oe_echo import OeEchoAction as FireAction
    from oe_echo import OeEchoObservation as FireObservation

    app = create_app(make_fire, FireAction, FireObservation, env_name="wildfire_env")
    metadata = load_environment_metadata(make_fire(), "wildfire_env")
    assert metadata.name == "OeEchoEnvironment"  # an instance answers for itself
    metadata = load_environment_metadata(make_fire, "wildfire_env")
    assert (metadata.name, metadata.readme_content) == ("wildfire_env", "# Fire\nPut it out.\n")
    for route in [r for r in app.routes if getattr(r, "path", None) == "/web"]:
        if "GET" in (getattr(route, "methods", None) or {"GET"}):
            app.routes.remove(route)

    @app.get("/web", response_class=HTMLResponse)
    async def fire_page() -> str:
        return f"<h1>{metadata.name}</h1>"

    with run_server(app) as url, httpx.Client(base_url=url) as http:
        page = http.get("/web")
        assert page.status_code == 200
        assert page.text == "<h1>wildfire_env</h1>"
