"""An app for the shutdown test of OpenReward sessions: a tool that takes its time,
and every close() appended to a file."""

import asyncio
import os

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, create_app, tool

CLOSE_LOG = os.environ["OPENENV_TEST_CLOSE_LOG"]


class Slow(CounterEnvironment):
    @tool
    async def slow(self, seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return "slept"

    def close(self) -> None:
        with open(CLOSE_LOG, "a") as log:
            log.write("closed\n")


app = create_app(
    Slow,
    CounterAction,
    CounterObservation,
    ConcurrencyConfig(max_concurrent_envs=4),
    shutdown_timeout=1,
)
