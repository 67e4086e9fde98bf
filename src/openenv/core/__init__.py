"""OpenEnv 0.10's ``openenv.core`` import paths, as thin aliases of openenv's API.

Environments and clients written for Hugging Face's OpenEnv import from here
(``openenv.core.env_server``, ``openenv.core.env_client``,
``openenv.core.client_types``, ...) and run on openenv unchanged. The server
half is imported on first use, as in ``openenv`` itself, so training code that
only drives environments never imports FastAPI.

>>> from openenv.core import EnvClient, StepResult
>>> from openenv.core._models import Action, Observation, State
>>> EnvClient.__mro__[1].__module__
'openenv.client.async_'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from openenv.core._models import Action, Observation, State
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.generic_client import GenericAction, GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from openenv.core.sync_client import SyncEnvClient

if TYPE_CHECKING:
    from openenv.core.env_server import (
        ConcurrencyConfig,
        Environment,
        create_app,
        create_fastapi_app,
    )

__all__ = [
    "Action",
    "ConcurrencyConfig",
    "EnvClient",
    "Environment",
    "GenericAction",
    "GenericEnvClient",
    "MCPToolClient",
    "Observation",
    "State",
    "StepResult",
    "SyncEnvClient",
    "create_app",
    "create_fastapi_app",
]


def __getattr__(name: str) -> Any:
    # As OpenEnv's: every name of openenv.core.env_server is one of openenv.core's too.
    server = importlib.import_module("openenv.core.env_server")
    if name in server.__all__:
        return getattr(server, name)
    raise AttributeError(f"module 'openenv.core' has no attribute {name!r}")
