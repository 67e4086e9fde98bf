"""Habits of OpenEnv's own environments and clients (its ``envs/*``), on openenv.

Each test is written as OpenEnv's environments are: their clients read the
observation's metadata among its fields, their environments keep resources
that belong to the thread that made them, and so on.
"""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from openenv import CapacityError
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment, Transform
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


class Hold(Action):
    hold: bool = False


class Where(Observation):
    made_here: bool = False  # this call runs on the thread that made the environment
    made_on: int = 0


class ThreadBound(Environment[Hold, Where, State]):
    """Keeps what belongs to the thread that made it (an sqlite3 connection does)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    holding = threading.Event()
    release = threading.Event()
    closed_here: list[bool] = []

    def __init__(self) -> None:
        super().__init__()
        self._made_on = threading.get_ident()
        self._db = sqlite3.connect(":memory:")  # usable on this thread only

    def _where(self) -> Where:
        self._db.execute("select 1")
        return Where(made_here=threading.get_ident() == self._made_on, made_on=self._made_on)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Where:
        return self._where()

    def step(self, action: Hold, timeout_s: float | None = None, **kwargs: Any) -> Where:
        if action.hold:
            type(self).holding.set()
            assert type(self).release.wait(30)
        return self._where()

    @property
    def state(self) -> State:
        return State()

    def close(self) -> None:
        type(self).closed_here.append(threading.get_ident() == self._made_on)
        self._db.close()


class BoundClient(EnvClient[Hold, Where, State]):
    pass


class OneThreadForAll(ThreadBound):
    REQUIRES_SINGLE_THREAD_EXECUTOR = True


def test_an_environment_keeps_the_thread_that_made_it() -> None:
    # OpenEnv runs each session's environment on one thread of its own; here a
    # session's step also ran on whichever worker thread was free.
    app = create_app(ThreadBound, Hold, Where, env_name="bound", max_concurrent_envs=2)
    with run_server(app) as url:
        with BoundClient(base_url=url) as first, BoundClient(base_url=url) as second:
            assert first.reset().observation.made_here
            assert second.reset().observation.made_here
            held = threading.Thread(target=second.step, args=(Hold(hold=True),))
            held.start()  # occupies the worker thread that served both so far
            try:
                assert ThreadBound.holding.wait(30)
                for _ in range(3):
                    assert first.step(Hold()).observation.made_here
            finally:
                ThreadBound.release.set()
                held.join(30)
        assert not held.is_alive()
        wait_until(lambda: len(ThreadBound.closed_here) == 2)
        assert ThreadBound.closed_here == [True, True]


def test_one_that_requires_a_single_thread_shares_it_with_every_session() -> None:
    app = create_app(OneThreadForAll, Hold, Where, env_name="single", max_concurrent_envs=2)
    with (
        run_server(app) as url,
        BoundClient(base_url=url) as first,
        BoundClient(base_url=url) as second,
    ):
        one, two = first.reset().observation, second.reset().observation
        assert (one.made_here, two.made_here) == (True, True)
        assert one.made_on == two.made_on
        assert first.step(Hold()).observation.made_here


def wait_until(predicate: Callable[[], bool], wait: float = 10.0) -> None:
    deadline = time.monotonic() + wait
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class Bonus(Transform[Board]):
    def __call__(self, observation: Board) -> Board:
        observation.metadata["transformed"] = True
        return observation


class AsyncJudge:
    """A rubric that is awaited, as OpenEnv's LLM judges are."""

    def __init__(self) -> None:
        self.resets = 0

    async def __call__(self, action: Move, observation: Board) -> float:
        return float(action.column) / 10

    async def reset_async(self) -> None:
        self.resets += 1

    def reset(self) -> None:
        raise AssertionError("reset_async is OpenEnv's choice where a rubric has one")


class JudgedGame(Environment[Move, Board, State]):
    """Uses OpenEnv's async rubric helpers and a ``Transform``, from its ``step_async``."""

    def __init__(self) -> None:
        super().__init__(transform=Bonus(), rubric=AsyncJudge())

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Board:
        raise AssertionError("reset_async is what OpenEnv's server calls")

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> Board:
        await self._reset_rubric_async()
        return self._apply_transform(Board(metadata={"resets": self.rubric.resets}))

    def step(self, action: Move, timeout_s: float | None = None, **kwargs: Any) -> Board:
        raise AssertionError("step_async is what OpenEnv's server calls")

    async def step_async(
        self, action: Move, timeout_s: float | None = None, **kwargs: Any
    ) -> Board:
        observation = Board(last=action.column)
        observation.reward = await self._apply_rubric_async(action, observation)
        return self._apply_transform(observation)

    @property
    def state(self) -> State:
        return State()


def test_openenvs_transform_and_async_rubric_helpers() -> None:
    app = create_app(JudgedGame, Move, Board, env_name="judged")
    with run_server(app) as url, GameClient(base_url=url) as env:
        assert env.reset().observation.metadata == {"resets": 1, "transformed": True}
        result = env.step(Move(column=4))
        assert result.reward == 0.4
        assert result.observation.metadata == {"transformed": True}


def test_openenvs_generic_client_plays_with_plain_dicts(echo_url: str) -> None:
    from openenv.core import GenericAction, GenericEnvClient, SessionCapacityError

    assert SessionCapacityError is CapacityError  # every env_server name, as on OpenEnv
    with GenericEnvClient(base_url=echo_url) as env:
        assert env.reset().observation["echoed_message"] == ""
        result = env.step(GenericAction(message="hi"))
        assert result.observation["echoed_message"] == "hi"
        assert result.reward == env.step({"message": "hi"}).reward
        assert env.state()["step_count"] == 2


def test_the_single_thread_of_an_app_ends_with_the_app() -> None:
    # Each app of an environment that requires a single thread left its thread
    # running for good, after its server stopped and the app was gone.
    def serve_one_session() -> None:
        app = create_app(OneThreadForAll, Hold, Where, env_name="single", max_concurrent_envs=1)
        with run_server(app) as url, BoundClient(base_url=url) as env:
            assert env.reset().observation.made_here

    before = threads_named("openenv-single-thread")
    for _ in range(3):
        serve_one_session()
    # Those this test made (an earlier test's may end meanwhile too).
    wait_until(lambda: not threads_named("openenv-single-thread") - before, wait=30)


def test_an_environment_left_without_close_ends_its_thread_with_it() -> None:
    # A shutdown leaves a session stuck in a call without close(): its own
    # thread, once the call returns, ran on for as long as the process.
    from openenv.core.env_server.session_thread import OnItsOwnThread

    before = threads_named("openenv-session")
    env = OnItsOwnThread(ThreadBound)()
    assert len(threads_named("openenv-session") - before) == 1
    del env
    wait_until(lambda: not threads_named("openenv-session") - before, wait=30)


def threads_named(name: str) -> set[threading.Thread]:
    """The live threads called ``name``, collecting garbage first (what ends them)."""
    gc.collect()
    return {t for t in threading.enumerate() if t.name == name}
