"""The echo environment: every message comes back, with a reward for its length."""

from echo_env.client import EchoEnv
from echo_env.models import EchoAction, EchoObservation

__all__ = ["EchoAction", "EchoEnv", "EchoObservation"]
