"""``openenv.core.env_server.exceptions``: OpenEnv 0.10's error names, onto openenv's."""

from __future__ import annotations

from openenv.errors import CapacityError as SessionCapacityError
from openenv.errors import ConcurrencyConfigurationError, OpenEnvError
from openenv.errors import FactoryError as EnvironmentFactoryError

__all__ = [
    "ConcurrencyConfigurationError",
    "EnvironmentFactoryError",
    "OpenEnvError",
    "SessionCapacityError",
]
