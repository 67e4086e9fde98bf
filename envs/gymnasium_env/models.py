"""The models of the served environments, derived from their Gymnasium spaces.

Any other environment's models come the same way:
``gymnasium_models("MountainCar-v0").action_cls``.

>>> CartPoleAction(action=1).model_dump()
{'action': 1}
>>> PendulumAction(action=[-0.5]).action
[-0.5]
"""

from openenv.adapters.gymnasium import GymnasiumState, gymnasium_models

CARTPOLE = gymnasium_models("CartPole-v1")
PENDULUM = gymnasium_models("Pendulum-v1")

CartPoleAction = CARTPOLE.action_cls
CartPoleObservation = CARTPOLE.observation_cls
PendulumAction = PENDULUM.action_cls
PendulumObservation = PENDULUM.observation_cls

__all__ = [
    "CARTPOLE",
    "PENDULUM",
    "CartPoleAction",
    "CartPoleObservation",
    "GymnasiumState",
    "PendulumAction",
    "PendulumObservation",
]
