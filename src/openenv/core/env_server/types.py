"""``openenv.core.env_server.types``: OpenEnv 0.10's model import path, onto openenv's models."""

from __future__ import annotations

from openenv.server.config import ConcurrencyConfig
from openenv.types import Action, EnvironmentMetadata, Observation, State

__all__ = ["Action", "ConcurrencyConfig", "EnvironmentMetadata", "Observation", "State"]
