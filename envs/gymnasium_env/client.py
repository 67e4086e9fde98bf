"""Typed clients: CartPole and Pendulum, and an untyped one for any environment."""

from gymnasium_env.models import (
    CartPoleAction,
    CartPoleObservation,
    PendulumAction,
    PendulumObservation,
)
from openenv import AnyObservation, EnvClient
from openenv.adapters.gymnasium import GymnasiumAction, GymnasiumState


class CartPoleEnv(EnvClient[CartPoleAction, CartPoleObservation, GymnasiumState]):
    """Drive a CartPole-v1 server.

    >>> import asyncio
    >>> async def main() -> None:
    ...     async with CartPoleEnv("http://localhost:8000") as env:
    ...         result = await env.reset(seed=0)
    ...         while not result.done:
    ...             result = await env.step(CartPoleAction(action=1))
    ...         print(result.observation.terminated, (await env.state()).step_count)
    >>> asyncio.run(main())  # doctest: +SKIP
    True 9
    """


class PendulumEnv(EnvClient[PendulumAction, PendulumObservation, GymnasiumState]):
    """Drive a Pendulum-v1 server (a Box action: ``PendulumAction(action=[torque])``)."""


class GymnasiumEnv(EnvClient[GymnasiumAction, AnyObservation, GymnasiumState]):
    """Drive any Gymnasium server; actions as dicts (``{"action": ...}``), observations untyped."""
