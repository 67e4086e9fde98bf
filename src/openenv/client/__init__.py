"""Drive environment sessions from training code; never imports the server."""

from typing import Any

from openenv._renamed import old_name as _old_name
from openenv.client._base import AnyObservation, http_url, ws_url
from openenv.client.async_ import EnvClient, WebSocketEnvClient
from openenv.client.mux import MuxClient, MuxSession, V2Unsupported
from openenv.client.pool import ServerPool
from openenv.client.remote import Environments, EnvSession, MultiEnvClient, RemoteEnv
from openenv.client.remote_sync import (
    SyncEnvironments,
    SyncEnvSession,
    SyncMultiEnvClient,
    SyncRemoteEnv,
)
from openenv.client.sync import SyncEnvClient
from openenv.client.trl_env import TRLEnv

__all__ = [
    "AnyObservation",
    "EnvClient",
    "EnvSession",
    "Environments",
    "MultiEnvClient",
    "MuxClient",
    "MuxSession",
    "RemoteEnv",
    "ServerPool",
    "SyncEnvClient",
    "SyncEnvSession",
    "SyncEnvironments",
    "SyncMultiEnvClient",
    "SyncRemoteEnv",
    "TRLEnv",
    "V2Unsupported",
    "WebSocketEnvClient",
    "http_url",
    "ws_url",
]


def __getattr__(name: str) -> Any:
    return _old_name(__name__, name, globals())
