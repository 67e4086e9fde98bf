"""Typed client for the echo environment."""

from openenv import EnvClient, State

from echo_env.models import EchoAction, EchoObservation


class EchoEnv(EnvClient[EchoAction, EchoObservation, State]):
    """Drive the echo environment server; one client is one session.

    >>> import asyncio
    >>> async def main() -> None:
    ...     async with EchoEnv("http://localhost:8000") as env:
    ...         await env.reset()
    ...         result = await env.step(EchoAction(message="hello"))
    ...         print(result.observation.echoed_message, result.reward)
    >>> asyncio.run(main())  # doctest: +SKIP
    hello 0.5
    """
