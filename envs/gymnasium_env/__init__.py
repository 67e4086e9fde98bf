"""Gymnasium environments over openenv sessions: CartPole and Pendulum, typed."""

from gymnasium_env.client import CartPoleEnv, GymnasiumEnv, PendulumEnv
from gymnasium_env.models import (
    CartPoleAction,
    CartPoleObservation,
    GymnasiumState,
    PendulumAction,
    PendulumObservation,
)

__all__ = [
    "CartPoleAction",
    "CartPoleEnv",
    "CartPoleObservation",
    "GymnasiumEnv",
    "GymnasiumState",
    "PendulumAction",
    "PendulumEnv",
    "PendulumObservation",
]
