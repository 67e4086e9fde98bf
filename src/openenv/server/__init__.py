"""Serve an environment: ``create_app`` and its configuration."""

from openenv.server.app import create_app
from openenv.server.config import ConcurrencyConfig, ServerSettings
from openenv.server.runner import serve

__all__ = ["ConcurrencyConfig", "ServerSettings", "create_app", "serve"]
