"""Typed client for the Wordle environment."""

from openenv import EnvClient
from wordle_env.models import WordleAction, WordleObservation, WordleState


class WordleEnv(EnvClient[WordleAction, WordleObservation, WordleState]):
    """Drive a Wordle server over one session.

    >>> import asyncio
    >>> async def main() -> None:
    ...     async with WordleEnv("http://localhost:8000") as env:
    ...         await env.reset(seed=0)
    ...         result = await env.step(WordleAction(guess="crane"))
    ...         print(result.observation.board[-1].pattern)
    >>> asyncio.run(main())  # doctest: +SKIP
    -Y---
    """
