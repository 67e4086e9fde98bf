"""The counter environment: count to a target with tools, then submit."""

from counter_env.client import CounterEnv
from counter_env.models import CounterAction, CounterObservation, CounterState, CounterTask

__all__ = ["CounterAction", "CounterEnv", "CounterObservation", "CounterState", "CounterTask"]
