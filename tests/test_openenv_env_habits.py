"""Habits of OpenEnv's own environments and clients (its ``envs/*``), on openenv.

Each test is written as OpenEnv's environments are: their clients read the
observation's metadata among its fields, their environments keep resources
that belong to the thread that made them, and so on.
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.testing import run_server


class Move(Action):
    column: int = 0


class Board(Observation):
    last: int = -1


class Game(Environment[Move, Board, State]):
    """Says what it did in its observations' metadata, as OpenEnv games do."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Board:
        self._state = State(episode_id=episode_id)
        return Board(metadata={"event": "reset"})

    def step(self, action: Move, timeout_s: float | None = None, **kwargs: Any) -> Board:
        self._state.step_count += 1
        return Board(last=action.column, reward=0.5, metadata={"event": f"dropped {action.column}"})

    @property
    def state(self) -> State:
        return self._state


class GameClient(EnvClient[Move, Board, State]):
    """``_parse_result`` as OpenEnv's env clients write it (connect4_env, textarena_env, ...)."""

    def _step_payload(self, action: Move) -> dict[str, Any]:
        return {"column": action.column}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Board]:
        obs_data = payload.get("observation", {})
        observation = Board(
            last=obs_data.get("last", -1),
            done=payload.get("done", False),
            reward=payload.get("reward"),
            metadata=obs_data.get("metadata", {}),
        )
        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


def test_a_client_reads_the_observations_metadata_among_its_fields() -> None:
    app = create_app(Game, Move, Board, env_name="game", max_concurrent_envs=2)
    with run_server(app) as url, GameClient(base_url=url) as env:
        assert env.reset().observation.metadata == {"event": "reset"}
        result = env.step(Move(column=3))
        assert result.observation.metadata == {"event": "dropped 3"}
        assert result.metadata == {"event": "dropped 3"}
        assert (result.observation.last, result.reward) == (3, 0.5)
