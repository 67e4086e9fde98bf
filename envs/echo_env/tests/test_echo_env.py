"""The echo environment against a real server on a free loopback port."""

import asyncio

import pytest
from openenv.testing import run_server

from echo_env import EchoAction, EchoEnv
from echo_env.server.app import app


def test_episode_through_the_sync_client() -> None:
    with run_server(app) as url, EchoEnv(url).sync() as env:
        assert env.reset(seed=1).observation.echoed_message == ""
        result = env.step(EchoAction(message="hello"))
        assert result.observation.echoed_message == "hello"
        assert result.observation.message_length == 5
        assert result.reward == 0.5
        assert env.state().step_count == 1


def test_many_concurrent_sessions() -> None:
    async def episode(url: str, i: int) -> float:
        async with EchoEnv(url) as env:
            await env.reset(seed=i)
            total = 0.0
            result = None
            while result is None or not result.done:
                result = await env.step(EchoAction(message="x" * (i % 7)))
                total += result.reward or 0.0
            return total

    async def main(url: str) -> list[float]:
        return await asyncio.gather(*(episode(url, i) for i in range(32)))

    with run_server(app) as url:
        totals = asyncio.run(main(url))
    # 50 steps per episode (the default), each rewarded len(message) / 10.
    assert totals == pytest.approx([50 * (i % 7) / 10 for i in range(32)])
