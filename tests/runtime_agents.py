"""Agents for the runtime tests.

They live in an importable module (the tests folder is on ``sys.path``) so that
worker processes, Ray workers and Spark's Python workers can unpickle them.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from echo_env.models import EchoAction, EchoObservation
from openenv.runtime import EpisodeSession

STEPS = 3


def messages(task_id: str, steps: int = STEPS) -> list[str]:
    """What ``echo_agent`` sends (and expects back) for a task."""
    return [f"{task_id}/{k}" for k in range(steps)]


async def echo_agent(session: EpisodeSession) -> list[str]:
    """Send the task's messages; return what the server echoed."""
    await session.reset()
    echoed = []
    for message in messages(session.task.id):
        result = await session.step(EchoAction(message=message))
        echoed.append(result.observation.echoed_message)
    return echoed


async def failing_agent(session: EpisodeSession) -> None:
    await session.reset()
    await session.step({"message": "about to fail"})
    raise ValueError(f"agent of {session.task.id} gave up")


async def hanging_agent(session: EpisodeSession) -> None:
    """Resets, then waits for something that never happens."""
    await session.reset()
    await asyncio.Event().wait()


async def chain_agent(session: EpisodeSession) -> list[str]:
    """The previous task's history plus this task's id (or how the previous one ended)."""
    prior = session.previous
    if prior is None:
        history: list[str] = []
    elif prior.ok:
        history = list(prior.value)
    else:
        history = [f"{prior.task_id}:{prior.status.value}"]
    await session.reset()
    await session.step({"message": session.task.id})
    return [*history, session.task.id]


async def exiting_agent(session: EpisodeSession) -> None:
    """Kills its worker process outright."""
    os._exit(3)


class Shouter:
    """An act() agent: repeats the last echo in capitals, with one more letter."""

    def act(self, observation: EchoObservation) -> EchoAction:
        return EchoAction(message=observation.echoed_message.upper() + "a")


class AsyncCounter:
    """An async act() agent that counts its steps in the message."""

    def __init__(self) -> None:
        self.calls = 0

    async def act(self, observation: Any) -> dict[str, str]:
        self.calls += 1
        return {"message": "x" * self.calls}


async def ping_agent(session: EpisodeSession) -> str:
    """One step of a ``servers.PingEnvironment``; the task called "slow" asks it to block."""
    await session.reset()
    result = await session.step({"message": session.task.id, "block": session.task.id == "slow"})
    return str(result.observation.message)


async def env_var_agent(session: EpisodeSession) -> str | None:
    """Reports the worker's OPENENV_TEST_MARK: proves options reached the worker."""
    return os.environ.get("OPENENV_TEST_MARK")
