"""The images serve with openenv's protocols, as ``openenv serve`` does.

Their ``CMD`` is plain ``uvicorn server.app:app`` (PID 1, SIGTERM straight to
it), so the protocols come from the image's ``UVICORN_*`` environment: the
WebSocket fast path, and the HTTP protocol that closes a connection whose
request headers never end (security.md). An image listens on every interface;
without the latter, each client that sends half a request holds a connection
for as long as it likes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfiles import free_port, parse, stop, wait_healthy

REPO = Path(__file__).parents[1]
DOCKERFILES = [
    REPO / "Dockerfile",
    REPO / "templates" / "env" / "server" / "Dockerfile",
    *sorted(REPO.glob("envs/*/server/Dockerfile")),
]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_image_closes_a_connection_whose_headers_never_end(
    dockerfile: Path, tmp_path: Path
) -> None:
    image_env = {k: v for k, v in parse(dockerfile).envs.items() if k.startswith("UVICORN_")}
    port = free_port()
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("UVICORN_")},
        **image_env,
        "UVICORN_HOST": "127.0.0.1",
        "UVICORN_PORT": str(port),
        "OPENENV_HEADER_TIMEOUT": "0.5",
    }
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        # The image's CMD, on the echo environment (every image's app is made the same way).
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "server.app:app"],
            cwd=REPO / "envs" / "echo_env",
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        with socket.create_connection(("127.0.0.1", port)) as half:
            half.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            half.settimeout(30)  # a bound for the test only: the server closes at 0.5 s
            try:
                assert half.recv(1024) == b""  # closed, nothing sent
            except TimeoutError:
                pytest.fail("the server still holds a connection whose headers never ended")
    finally:
        stop(proc)
