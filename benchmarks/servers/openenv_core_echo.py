"""OpenEnv's echo environment (``openenv-core`` 0.3.0), as its template ships it.

Runs only in the separate virtual environment that ``benchmarks/run.py``
makes (both packages import as ``openenv``). The session cap comes from
``OPENENV_MAX_CONCURRENT_ENVS``.
"""

import os
from uuid import uuid4

from pydantic import Field

from openenv.core.env_server.http_server import create_app  # type: ignore[import-not-found]
from openenv.core.env_server.interfaces import Environment  # type: ignore[import-not-found]
from openenv.core.env_server.types import (  # type: ignore[import-not-found]
    Action,
    Observation,
    State,
)


class EchoAction(Action):  # type: ignore[misc]
    message: str = Field(..., description="Message to echo back")


class EchoObservation(Observation):  # type: ignore[misc]
    echoed_message: str = Field(default="", description="The echoed message")
    message_length: int = Field(default=0, description="Length of the echoed message")


class EchoEnvironment(Environment):  # type: ignore[misc]
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self) -> EchoObservation:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        return EchoObservation(echoed_message="", message_length=0, done=False, reward=0.0)

    def step(self, action: EchoAction) -> EchoObservation:  # type: ignore[override]
        self._state.step_count += 1
        return EchoObservation(
            echoed_message=action.message,
            message_length=len(action.message),
            done=False,
            reward=len(action.message) * 0.1,
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    EchoEnvironment,
    EchoAction,
    EchoObservation,
    env_name="echo_env",
    max_concurrent_envs=int(os.environ.get("OPENENV_MAX_CONCURRENT_ENVS", "64")),
)
