"""`uvicorn server.app:app` picks the fast stack with the default install."""

from __future__ import annotations

import uvicorn

from echo_env.server.app import app


def test_default_install_serves_with_uvloop_httptools_and_websockets() -> None:
    config = uvicorn.Config(app)
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
    assert config.ws_protocol_class is not None
    assert config.ws_protocol_class.__module__.startswith("uvicorn.protocols.websockets.websockets")
    loop = config.get_loop_factory()
    assert loop is not None
    assert loop.__module__.startswith("uvloop")
