"""``openenv.core.env_server.interfaces``: OpenEnv 0.10's ``Environment`` import path."""

from __future__ import annotations

from openenv.environment import Environment

__all__ = ["Environment"]
