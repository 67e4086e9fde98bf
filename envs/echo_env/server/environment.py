"""The echo environment itself."""

import uuid
from typing import Any

from openenv import Environment, State

from echo_env.models import EchoAction, EchoObservation


class EchoEnvironment(Environment[EchoAction, EchoObservation, State]):
    """Echoes every message back; the reward is the message's length / 10.

    The episode is done after ``max_steps`` steps; stepping on afterwards is
    allowed and keeps ``done`` true, which suits closed-loop benchmarks.

    >>> env = EchoEnvironment(max_steps=2)
    >>> env.reset(seed=1).echoed_message
    ''
    >>> env.step(EchoAction(message="hello")).reward
    0.5
    >>> env.step(EchoAction(message="bye")).done
    True
    """

    # Instances share nothing, so one process may hold many of them.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_steps: int = 50) -> None:
        self.max_steps = max_steps
        self._state = State(episode_id=uuid.uuid4().hex)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> EchoObservation:
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return EchoObservation(echoed_message="", message_length=0, reward=0.0, done=False)

    def step(self, action: EchoAction, **kwargs: Any) -> EchoObservation:
        message = action.message
        self._state.step_count += 1
        return EchoObservation(
            echoed_message=message,
            message_length=len(message),
            reward=len(message) / 10,
            done=self._state.step_count >= self.max_steps,
        )

    @property
    def state(self) -> State:
        return self._state
