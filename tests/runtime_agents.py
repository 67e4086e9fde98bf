"""Agents for the runtime tests.

They live in an importable module (the tests folder is on ``sys.path``) so that
worker processes, Ray workers and Spark's Python workers can unpickle them.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import threading
import time
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


def append_line(path: str, line: str) -> None:
    """One whole line, appended atomically (O_APPEND), from any process."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def journal_lines(path: str) -> list[list[str]]:
    """The journal's lines, split into words; none if it does not exist yet."""
    if not os.path.exists(path):
        return []
    with open(path) as file:
        return [line.split() for line in file if line.endswith("\n")]


async def wait_for_file(path: str, deadline: float = 60.0) -> bool:
    """Whether ``path`` appeared within ``deadline`` seconds (polled)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not _exists(path):
        if loop.time() > end:
            return False
        await asyncio.sleep(0.01)
    return True


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _claim(path: str) -> bool:
    """Write this process's pid to ``path``, unless it is there already."""
    if os.path.exists(path):
        return False
    with open(path + ".tmp", "w") as file:
        file.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    return True


class Journal:
    """``echo_agent``, writing ``start ID PID`` and ``done ID PID`` lines to ``path``.

    Every invocation of the agent is on record, in whatever process it runs,
    so a test can tell an episode played twice from one played once.

    ``hold``: the task that, on its first invocation, writes its pid to
    ``path + ".held"`` and then waits forever (for its worker to be killed).
    ``straggler``: the task that waits until every other task is done (or 60
    s) and returns whether they all were, rather than the echoes.
    ``gate``: the task that waits for the file ``gate`` (or 60 s) and
    returns whether it appeared.
    """

    def __init__(
        self,
        path: str,
        *,
        hold: str | None = None,
        straggler: str | None = None,
        others: int = 0,
        gate: tuple[str, str] | None = None,
    ) -> None:
        self.path = path
        self.hold = hold
        self.straggler = straggler
        self.others = others
        self.gate = gate

    async def __call__(self, session: EpisodeSession) -> Any:
        task_id = session.task.id
        append_line(self.path, f"start {task_id} {os.getpid()}")
        held = self.path + ".held"
        value: Any
        if task_id == self.hold and _claim(held):
            await asyncio.Event().wait()
        if task_id == self.straggler:
            value = await self._others_done()
        elif self.gate is not None and task_id == self.gate[0]:
            value = await wait_for_file(self.gate[1])
        else:
            value = await echo_agent(session)
        append_line(self.path, f"done {task_id} {os.getpid()}")
        return value

    async def _others_done(self) -> bool:
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while loop.time() < end:
            if sum(words[0] == "done" for words in journal_lines(self.path)) >= self.others:
                return True
            await asyncio.sleep(0.01)
        return False


async def blocking_async_agent(session: EpisodeSession) -> None:
    """Blocks its event loop (``time.sleep`` in ``async def``): only a kill stops it."""
    await session.reset()
    time.sleep(60)  # noqa: ASYNC251 - the point: an agent that blocks its loop


class BlockingActor:
    """A sync ``act()`` that blocks for a minute (a slow model call)."""

    def act(self, observation: Any) -> EchoAction:
        time.sleep(60)
        return EchoAction(message="too late")


async def thread_stuck_agent(session: EpisodeSession) -> None:
    """Blocks in ``asyncio.to_thread`` (as the docs advise for a blocking call) for good."""
    await asyncio.to_thread(_stuck)


def _stuck() -> None:
    # The test waits for this line: the call is blocking its thread from now on.
    print("stuck in a thread", file=sys.stderr, flush=True)
    threading.Event().wait()


class Gated:
    """Resets, touches ``ready`` (if given), waits for the file ``gate``, then plays ``echo_agent``.

    The test changes the world meanwhile (stops the server answering, say).
    """

    def __init__(self, gate: str, ready: str | None = None) -> None:
        self.gate = gate
        self.ready = ready

    async def __call__(self, session: EpisodeSession) -> list[str]:
        await session.reset()
        if self.ready is not None:
            append_line(self.ready, session.task.id)
        assert await wait_for_file(self.gate)
        return await echo_agent(session)


async def held_echo(session: EpisodeSession) -> str:
    """For ``openenv run``: journals to ``$OPENENV_TEST_JOURNAL``; with ``$OPENENV_TEST_HOLD=k``
    episodes ``task-k`` and later wait forever (until the run is killed)."""
    journal = os.environ["OPENENV_TEST_JOURNAL"]
    task_id = session.task.id
    append_line(journal, f"start {task_id} {os.getpid()}")
    hold = os.environ.get("OPENENV_TEST_HOLD")
    if hold is not None and int(task_id.rpartition("-")[2]) >= int(hold):
        await asyncio.Event().wait()
    await session.reset()
    result = await session.step(EchoAction(message=task_id))
    append_line(journal, f"done {task_id} {os.getpid()}")
    return str(result.observation.echoed_message)


async def answer_agent(session: EpisodeSession) -> str:
    """Answers its task's input, with no environment: an AWorld-style agent."""
    return f"answer to {session.input}"


async def odd_value_agent(session: EpisodeSession) -> Any:
    """Returns what agents return and JSON has no direct spelling for."""
    import numpy as np

    if session.task.id == "task-0":
        return {1: "one", "score": np.float32(0.5), "logits": np.arange(3)}
    return 2**70  # past orjson's 64 bits


async def non_finite_value_agent(session: EpisodeSession) -> Any:
    """Returns NaN and infinities, alone, in containers and in NumPy arrays."""
    import numpy as np

    return {
        "loss": math.nan,
        "bounds": (-math.inf, 1.5),
        "scores": np.array([0.5, np.inf], dtype=np.float32),
        "best": np.float64(np.nan),
        "counts": np.arange(2),
        "name": "NaN",
    }
