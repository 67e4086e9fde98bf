"""Serve an environment: ``create_app`` and its configuration."""

from openenv.server.app import create_app
from openenv.server.config import ConcurrencyConfig, ServerSettings

__all__ = ["ConcurrencyConfig", "ServerSettings", "create_app"]
