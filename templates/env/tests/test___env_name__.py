"""__env_name__ against a real server on a free loopback port: run `pytest` in this folder."""

import asyncio

import pytest
from openenv import EnvExecutionError, EnvValidationError
from openenv.testing import run_server

# The package, not its classes: imported here, a class named Test... (as every
# class of an environment named test_...) is one pytest tries to collect, and warns.
import __env_name__
from __env_name__.server.app import app


def next_guess(low: int, high: int, hint: str, guess: int) -> tuple[int, int]:
    """Narrow the range after a hint: a binary search needs at most 7 guesses."""
    return (guess + 1, high) if hint == "higher" else (low, guess - 1)


def test_an_episode_through_the_sync_client() -> None:
    with run_server(app) as url, __env_name__.__Prefix__Env(url).sync() as env:
        result = env.reset(seed=7)
        low, high = 0, 99
        while not result.done:
            guess = (low + high) // 2
            result = env.step(__env_name__.__Prefix__Action(guess=guess))
            low, high = next_guess(low, high, result.observation.hint, guess)
        assert result.observation.hint == "correct"
        assert result.reward == 1.0
        assert env.state().step_count == 7 - result.observation.guesses_left


def test_bad_requests_are_refused_and_the_session_goes_on() -> None:
    with run_server(app) as url, __env_name__.__Prefix__Env(url).sync() as env:
        with pytest.raises(EnvExecutionError, match="reset"):
            env.step(__env_name__.__Prefix__Action(guess=1))  # no episode yet
        env.reset(seed=1)
        with pytest.raises(EnvValidationError):
            env.step({"guess": 100})  # out of range: refused before the environment sees it
        assert env.step(__env_name__.__Prefix__Action(guess=17)).observation.hint == "correct"


def test_concurrent_sessions_play_independent_episodes() -> None:
    async def play(url: str, seed: int) -> float:
        async with __env_name__.__Prefix__Env(url) as env:
            result = await env.reset(seed=seed)
            low, high = 0, 99
            while not result.done:
                guess = (low + high) // 2
                result = await env.step(__env_name__.__Prefix__Action(guess=guess))
                low, high = next_guess(low, high, result.observation.hint, guess)
            return result.reward or 0.0

    async def main(url: str) -> list[float]:
        return await asyncio.gather(*(play(url, seed) for seed in range(32)))

    with run_server(app) as url:
        assert asyncio.run(main(url)) == [1.0] * 32
