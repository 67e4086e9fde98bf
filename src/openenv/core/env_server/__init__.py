"""``openenv.core.env_server``: what OpenEnv 0.10 environments import, onto openenv.

>>> from openenv.core.env_server import Action, Environment, create_app
>>> from openenv import Action as OurAction
>>> issubclass(Action, OurAction)  # with OpenEnv's model settings (see openenv.core._models)
True
"""

from __future__ import annotations

from openenv.core.env_server.exceptions import (
    ConcurrencyConfigurationError,
    EnvironmentFactoryError,
    OpenEnvError,
    SessionCapacityError,
)
from openenv.core.env_server.http_server import create_app, create_fastapi_app
from openenv.core.env_server.interfaces import (
    Environment,
    Message,
    ModelTokenizer,
    TaskProvider,
    Transform,
)
from openenv.core.env_server.types import (
    Action,
    ConcurrencyConfig,
    EnvironmentMetadata,
    Observation,
    State,
)

__all__ = [
    "Action",
    "ConcurrencyConfig",
    "ConcurrencyConfigurationError",
    "Environment",
    "EnvironmentFactoryError",
    "EnvironmentMetadata",
    "Message",
    "ModelTokenizer",
    "Observation",
    "OpenEnvError",
    "SessionCapacityError",
    "State",
    "TaskProvider",
    "Transform",
    "create_app",
    "create_fastapi_app",
]
