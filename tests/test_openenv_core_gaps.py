"""OpenEnv 0.10 environments and scripts that use more of ``openenv.core`` than
its template: numpy fields, the task API as instance methods, rubrics,
``web_interface`` and ``containers``; each served by openenv's ``create_app``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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
