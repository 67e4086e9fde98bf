"""__env_name__: an openenv environment. Agents import the client and the models from here."""

from __env_name__.client import __Prefix__Env
from __env_name__.models import __Prefix__Action, __Prefix__Observation

__all__ = ["__Prefix__Action", "__Prefix__Env", "__Prefix__Observation"]
