"""The fast stack: uvloop, httptools and openenv's WebSocket protocol; the collector's tuning."""

from __future__ import annotations

import gc

import uvicorn

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.app import app
from echo_env.server.environment import EchoEnvironment
from openenv import WebSocketEnvClient, create_app
from openenv.testing import run_server


def test_default_install_serves_with_uvloop_httptools_and_websockets() -> None:
    config = uvicorn.Config(app)
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
    assert config.ws_protocol_class is not None
    assert config.ws_protocol_class.__module__.startswith("uvicorn.protocols.websockets.websockets")
    loop = config.get_loop_factory()
    assert loop is not None
    assert loop.__module__.startswith("uvloop")


def test_openenv_serve_uses_the_fast_websocket_protocol() -> None:
    from openenv.server.runner import uvicorn_config
    from openenv.server.wsprotocol import WebSocketProtocol

    config = uvicorn_config(app)
    config.load()
    assert config.ws_protocol_class is WebSocketProtocol
    # The import string the README, the Dockerfiles (UVICORN_WS) and --ws use.
    named = uvicorn.Config(app, ws="openenv.server.wsprotocol:WebSocketProtocol")
    named.load()
    assert named.ws_protocol_class is WebSocketProtocol


def test_serving_tunes_the_collector_and_shutdown_restores_it() -> None:
    before = gc.get_threshold()
    tuned = create_app(EchoEnvironment, EchoAction, EchoObservation, gc_threshold=before[0] + 4321)
    with run_server(tuned) as url, WebSocketEnvClient(url).sync() as client:
        client.reset()
        # The server runs in this process: its collector is this one.
        assert gc.get_threshold() == (before[0] + 4321, *before[1:])
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0

    untouched = create_app(EchoEnvironment, EchoAction, EchoObservation, gc_threshold=None)
    with run_server(untouched):
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == 0
