"""Typed client for the counter environment."""

from counter_env.models import CounterAction, CounterObservation, CounterState
from openenv import EnvClient


class CounterEnv(EnvClient[CounterAction, CounterObservation, CounterState]):
    """Drive a counter environment server over one session.

    >>> import asyncio
    >>> async def main() -> None:
    ...     async with CounterEnv("http://localhost:8000") as env:
    ...         await env.reset(seed=3)
    ...         print((await env.call_tool("increment", amount=2)).data)
    >>> asyncio.run(main())  # doctest: +SKIP
    {'value': 2}
    """
