"""The benchmark environment against a real server on a free loopback port."""

import asyncio
import os

import pytest

from benchmark_env import BenchAction, BenchmarkEnv
from benchmark_env.server.app import app, async_app
from openenv import EnvValidationError
from openenv.testing import run_server


@pytest.mark.parametrize("served", [app, async_app], ids=["def-step", "async-def-step"])
def test_steps_report_process_and_session(served: object) -> None:
    async def episode(url: str) -> list[tuple[int, str, int]]:
        async with BenchmarkEnv(url) as env:
            first = await env.reset()
            seen = [(first.observation.pid, first.observation.session, first.observation.step)]
            for action in (BenchAction(seconds=0.001), BenchAction(seconds=0.001, work="cpu")):
                obs = (await env.step(action)).observation
                seen.append((obs.pid, obs.session, obs.step))
            return seen

    async def main(url: str) -> list[list[tuple[int, str, int]]]:
        return await asyncio.gather(*(episode(url) for _ in range(4)))

    with run_server(served) as url:
        episodes = asyncio.run(main(url))
    for seen in episodes:
        assert [step for _, _, step in seen] == [0, 1, 2]
        assert {pid for pid, _, _ in seen} == {os.getpid()}  # served in this process
        assert len({session for _, session, _ in seen}) == 1  # one fingerprint per session
    assert len({seen[0][1] for seen in episodes}) == 4  # and a different one for each


def test_a_negative_wait_is_a_validation_error() -> None:
    with run_server(app) as url, BenchmarkEnv(url).sync() as env:
        env.reset()
        with pytest.raises(EnvValidationError) as invalid:
            env.step({"seconds": -1})
        assert invalid.value.errors[0]["loc"] == ["seconds"]
        assert env.step(BenchAction()).observation.step == 1
