"""Environments for ``isolation="process"`` tests: one that crashes on request,
and two whose ``reset`` takes only some arguments.

It lives in a module of its own (not a test file) so that the fork server
that starts isolated environments can import it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any, Literal

from openenv import Action, EnvError, Environment, Observation, State, TaskSpec
from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironment


class Crash(Action):
    how: Literal["no", "exit", "segfault", "kill", "raise", "hang", "unfit", "refuse"] = "no"


class Sighting(Observation):
    pid: int
    steps: int = 0


class Refused(EnvError):
    """An error whose constructor takes what the message is made of, not the message."""

    def __init__(self, move: str) -> None:
        super().__init__(f"move {move!r} is not allowed")
        self.move = move


class Crashy(Environment[Crash, Sighting, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> Sighting:
        self._state = State(episode_id=episode_id)
        return Sighting(pid=os.getpid())

    def step(self, action: Crash, **kwargs: Any) -> Sighting:
        if action.how == "exit":
            os._exit(3)
        if action.how == "segfault":
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        if action.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action.how == "hang":
            time.sleep(3600)  # as stuck as C code that never returns
        if action.how == "raise":
            raise ValueError("asked to raise")
        if action.how == "refuse":
            raise Refused(action.how)
        if action.how == "unfit":
            return {"pid": os.getpid()}  # type: ignore[return-value]  # not an Observation
        self._state.step_count += 1
        return Sighting(pid=os.getpid(), steps=self._state.step_count, reward=1.0)

    @property
    def state(self) -> State:
        return self._state


def hangs_if(flag: str) -> Crashy:
    """Hang for good while the file ``flag`` exists (writing its pid into it first)."""
    if not os.path.exists(flag):
        return Crashy()
    with open(flag, "w") as file:
        file.write(str(os.getpid()))
    time.sleep(3600)  # as stuck as a simulator that never comes up
    return Crashy()


class Goal(TaskSpec):
    target: int = 7


class Told(Observation):
    """What ``reset`` was given, as the environment saw it."""

    task_class: str = ""
    target: int | None = None
    seed: int | None = None


class Picky(Environment[Crash, Told, State]):
    """A ``reset`` without ``**kwargs``, and a task class of its own."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, task: Goal | None = None) -> Told:
        return Told(task_class=type(task).__name__, target=getattr(task, "target", None), seed=seed)

    def step(self, action: Crash) -> Told:
        return Told()

    @property
    def state(self) -> State:
        return State()


class OpenEnvPicky(OpenEnvEnvironment[Crash, Told, State]):
    """Written for OpenEnv, whose server drops what ``reset`` does not take."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None) -> Told:
        return Told(seed=seed)

    def step(self, action: Crash) -> Told:
        return Told()

    @property
    def state(self) -> State:
        return State()
