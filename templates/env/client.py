"""Typed client for __env_name__: replies are parsed into its models."""

from openenv import EnvClient, State

from __env_name__.models import __Prefix__Action, __Prefix__Observation


class __Prefix__Env(EnvClient[__Prefix__Action, __Prefix__Observation, State]):
    """Drive the __env_name__ server; one client is one session.

    >>> import asyncio
    >>> async def main() -> None:
    ...     async with __Prefix__Env("http://localhost:8000") as env:
    ...         await env.reset(seed=7)
    ...         result = await env.step(__Prefix__Action(guess=50))
    ...         print(result.observation.hint, result.reward)
    >>> asyncio.run(main())  # doctest: +SKIP
    lower 0.0
    """
