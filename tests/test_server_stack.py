"""The fast stack: uvloop, httptools and openenv's WebSocket protocol; the collector's tuning."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys
import threading
import time

import pytest
import uvicorn

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.app import app
from echo_env.server.environment import EchoEnvironment
from openenv import WebSocketEnvClient, create_app
from openenv.server.gc_tuning import DEFAULT_GC_THRESHOLD
from openenv.server.httpprotocol import HttpToolsProtocol
from openenv.server.runner import uvicorn_config
from openenv.server.wsprotocol import WebSocketProtocol
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

    untouched = create_app(EchoEnvironment, EchoAction, EchoObservation)  # not asked: by default
    with run_server(untouched) as url, WebSocketEnvClient(url).sync() as client:
        client.reset()
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == 0


# Run in a fresh interpreter: the collector is the process's, and apps served
# in this one (the session's echo server) may have tuned it already.
SERVE_AND_REPORT = """
import gc, threading, time
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import create_app
from openenv.server.runner import GracefulServer, uvicorn_config

before = gc.get_threshold()
app = create_app(EchoEnvironment, EchoAction, EchoObservation)
server = GracefulServer(uvicorn_config(app, host="127.0.0.1", port=0, log_level="warning"))
thread = threading.Thread(target=server.run)
thread.start()
deadline = time.monotonic() + 30
while not server.started and thread.is_alive() and time.monotonic() < deadline:
    time.sleep(0.01)
serving = (gc.get_threshold(), gc.get_freeze_count())
server.should_exit = True
thread.join(30)
print(before, serving, (gc.get_threshold(), gc.get_freeze_count()))
"""


def test_openenv_serve_tunes_the_collector_for_the_process_it_owns() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SERVE_AND_REPORT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    before, serving, after = ast.literal_eval(f"[{done.stdout.replace(') (', '), (')}]")
    assert before[0] < DEFAULT_GC_THRESHOLD  # CPython's default: the app did not touch it
    assert serving[0] == (DEFAULT_GC_THRESHOLD, *before[1:])
    assert serving[1] > 0  # startup's objects frozen
    assert after == (before, 0)


def test_untested_uvicorn_or_websockets_releases_get_uvicorns_own_protocols(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import openenv.server.protocols as protocols

    fast = protocols.default_protocols()
    assert fast == (WebSocketProtocol, HttpToolsProtocol)  # the releases installed are tested
    with caplog.at_level("WARNING", logger="openenv.server"):
        stock = protocols.default_protocols({"uvicorn": "0.99.0", "websockets": "17.4"})
    assert stock == ("websockets-sansio", "httptools")
    assert [r.getMessage() for r in caplog.records] == [
        "openenv: uvicorn 0.99.0 (tested: 0.54); serving with uvicorn's own protocols, "
        "correct but slower"
    ]
    # And a server on them plays sessions as usual.
    fresh = create_app(EchoEnvironment, EchoAction, EchoObservation)  # not the shared echo app
    config = uvicorn_config(fresh, host="127.0.0.1", port=0, ws=stock[0], http=stock[1])
    server = uvicorn.Server(config)  # not GracefulServer: its shutdown drains every service here
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive(), "the server stopped while starting"
            assert time.monotonic() < deadline, "the server started within 30 s"
            time.sleep(0.01)
        (sock,) = server.servers[0].sockets
        host, port = sock.getsockname()[:2]
        with WebSocketEnvClient(f"http://{host}:{port}").sync() as client:
            client.reset()
            assert client.step({"message": "stock"}).observation.echoed_message == "stock"
    finally:
        server.should_exit = True
        thread.join(30)


def test_openenv_stock_protocols_picks_uvicorns_own_on_purpose(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dependencies.md: ``OPENENV_STOCK_PROTOCOLS=1`` picks them, and warns of nothing."""
    import openenv.server.protocols as protocols

    monkeypatch.setenv("OPENENV_STOCK_PROTOCOLS", "1")
    with caplog.at_level("WARNING", logger="openenv.server"):
        assert protocols.default_protocols() == ("websockets-sansio", "httptools")
        assert uvicorn_config(object()).ws == "websockets-sansio"
    assert caplog.records == []
