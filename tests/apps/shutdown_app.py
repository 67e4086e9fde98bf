"""An app for the graceful-shutdown test: every close() is appended to a file."""

import os
from typing import Any

from openenv import ConcurrencyConfig, Environment, State, create_app
from openenv.client import AnyObservation
from openenv.types import Action

CLOSE_LOG = os.environ["OPENENV_TEST_CLOSE_LOG"]


class Nothing(Action):
    pass


class Recorder(Environment[Nothing, AnyObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
        self.name = episode_id
        return AnyObservation()

    def step(self, action: Nothing, **kwargs: Any) -> Any:
        return AnyObservation()

    @property
    def state(self) -> State:
        return State(episode_id=self.name)

    def close(self) -> None:
        with open(CLOSE_LOG, "a") as log:
            log.write(f"{self.name}\n")


app = create_app(Recorder, Nothing, AnyObservation, ConcurrencyConfig(max_concurrent_envs=200))
