"""Typed client for the benchmark environment."""

from benchmark_env.models import BenchAction, BenchObservation
from openenv import EnvClient, State


class BenchmarkEnv(EnvClient[BenchAction, BenchObservation, State]):
    """Drive a benchmark environment server.

    >>> import asyncio
    >>> async def main() -> None:
    ...     async with BenchmarkEnv("http://localhost:8000") as env:
    ...         await env.reset()
    ...         result = await env.step(BenchAction(seconds=0.01))
    ...         print(result.observation.step)
    >>> asyncio.run(main())  # doctest: +SKIP
    1
    """
