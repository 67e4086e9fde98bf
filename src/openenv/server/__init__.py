"""Serve an environment: ``create_app`` and its configuration."""

from openenv.server.app import create_app
from openenv.server.config import ConcurrencyConfig, ServerSettings
from openenv.server.multi import EnvSpec, create_multi_app
from openenv.server.runner import serve

__all__ = [
    "ConcurrencyConfig",
    "EnvSpec",
    "ServerSettings",
    "create_app",
    "create_multi_app",
    "serve",
]
