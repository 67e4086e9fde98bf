"""The benchmark environment: steps that wait, sleep or burn CPU on request."""

import asyncio
import os
import time
import uuid
from typing import Any

from benchmark_env.models import BenchAction, BenchObservation
from openenv import Environment, State


def burn(seconds: float) -> None:
    """Keep the CPU busy for ``seconds`` (of wall time), holding the GIL.

    >>> started = time.perf_counter(); burn(0.01); time.perf_counter() - started >= 0.01
    True
    """
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class BenchmarkEnvironment(Environment[BenchAction, BenchObservation, State]):
    """Each step takes ``action.seconds``; the observation says which process and session ran it.

    ``work="wait"`` blocks in ``time.sleep`` (a plain ``def step`` runs off the
    event loop, so other sessions go on); ``work="cpu"`` burns the CPU. The
    session fingerprint is fixed when the instance is made, so it tells apart
    the sessions a server holds.

    >>> env = BenchmarkEnvironment()
    >>> env.reset(seed=1).step
    0
    >>> obs = env.step(BenchAction(seconds=0.0))
    >>> obs.step, obs.pid == os.getpid(), obs.session == env.fingerprint
    (1, True, True)
    """

    # Instances share nothing, so one process may hold many of them.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self.fingerprint = uuid.uuid4().hex[:16]
        self._state = State(episode_id=self.fingerprint)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> BenchObservation:
        self._state = State(episode_id=episode_id or self.fingerprint, step_count=0)
        return self._observation()

    def step(self, action: BenchAction, **kwargs: Any) -> BenchObservation:
        if action.work == "cpu":
            burn(action.seconds)
        elif action.seconds:
            time.sleep(action.seconds)
        self._state.step_count += 1
        return self._observation()

    @property
    def state(self) -> State:
        return self._state

    def _observation(self) -> BenchObservation:
        return BenchObservation(
            pid=os.getpid(), session=self.fingerprint, step=self._state.step_count, reward=0.0
        )


class AsyncBenchmarkEnvironment(BenchmarkEnvironment):
    """The same with an ``async def step``: ``wait`` is ``asyncio.sleep`` on the event loop.

    >>> env = AsyncBenchmarkEnvironment()
    >>> _ = env.reset()
    >>> asyncio.run(env.step(BenchAction(seconds=0.001))).step
    1
    """

    async def step(self, action: BenchAction, **kwargs: Any) -> BenchObservation:  # type: ignore[override]
        if action.work == "cpu":
            burn(action.seconds)  # on the loop, on purpose: this is what async CPU work costs
        elif action.seconds:
            await asyncio.sleep(action.seconds)
        self._state.step_count += 1
        return self._observation()
