"""Drive environment sessions from training code; never imports the server."""

from openenv.client._base import AnyObservation, http_url, ws_url
from openenv.client.async_ import EnvClient, WebSocketEnvClient
from openenv.client.sync import SyncEnvClient

__all__ = [
    "AnyObservation",
    "EnvClient",
    "SyncEnvClient",
    "WebSocketEnvClient",
    "http_url",
    "ws_url",
]
