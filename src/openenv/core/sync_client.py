"""``openenv.core.sync_client``: OpenEnv 0.10's ``SyncEnvClient`` import path."""

from __future__ import annotations

from openenv.client.sync import SyncEnvClient

__all__ = ["SyncEnvClient"]
