"""Drive environment sessions from training code; never imports the server."""

from openenv.client._base import AnyObservation, http_url, ws_url
from openenv.client.async_ import EnvClient, WebSocketEnvClient
from openenv.client.mux import MuxClient, MuxSession, V2Unsupported
from openenv.client.pool import ServerPool
from openenv.client.remote import Environments, EnvSession, OpenEnvClient, RemoteEnv
from openenv.client.remote_sync import (
    SyncEnvironments,
    SyncEnvSession,
    SyncOpenEnvClient,
    SyncRemoteEnv,
)
from openenv.client.sync import SyncEnvClient
from openenv.client.trl_env import TRLEnv

__all__ = [
    "AnyObservation",
    "EnvClient",
    "EnvSession",
    "Environments",
    "MuxClient",
    "MuxSession",
    "OpenEnvClient",
    "RemoteEnv",
    "ServerPool",
    "SyncEnvClient",
    "SyncEnvSession",
    "SyncEnvironments",
    "SyncOpenEnvClient",
    "SyncRemoteEnv",
    "TRLEnv",
    "V2Unsupported",
    "WebSocketEnvClient",
    "http_url",
    "ws_url",
]
