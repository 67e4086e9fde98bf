"""Typed client for the coding environment."""

from coding_env.models import CodeAction, CodeObservation, CodingState
from openenv import EnvClient


class CodingEnv(EnvClient[CodeAction, CodeObservation, CodingState]):
    """Drive a coding environment server over one session.

    >>> import asyncio
    >>> async def main() -> None:
    ...     async with CodingEnv("http://localhost:8000") as env:
    ...         await env.reset(seed=0)
    ...         result = await env.step(CodeAction(code="print(6 * 7)"))
    ...         print(result.observation.execution.stdout)
    >>> asyncio.run(main())  # doctest: +SKIP
    42
    """
