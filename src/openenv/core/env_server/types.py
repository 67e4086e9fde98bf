"""``openenv.core.env_server.types``: OpenEnv 0.10's model import path.

``Action``, ``Observation`` and ``State`` are OpenEnv's (subclasses of openenv's
with OpenEnv's model settings: see ``openenv.core._models``); the others are
openenv's own.
"""

from __future__ import annotations

from openenv.core._models import Action, Observation, State
from openenv.server.config import ConcurrencyConfig
from openenv.types import EnvironmentMetadata

__all__ = ["Action", "ConcurrencyConfig", "EnvironmentMetadata", "Observation", "State"]
