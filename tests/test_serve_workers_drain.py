"""``openenv serve --workers N`` as it drains: what a client trying to connect meanwhile sees."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cli_envs import write_env
from test_cli_serve import Ping, eventually, health, open_sessions, serving
from test_serve_supervisor import reaped

# A step that holds its worker's drain until the test lets it go.
GATED = """\
import time
from pathlib import Path

HERE = Path(__file__).parent


class Gated(PidEnvironment):
    def step(self, action: Ping, **kwargs: Any) -> Where:
        (HERE / f"stepping-{os.getpid()}").touch()
        while not (HERE / "go").exists():
            time.sleep(0.01)
        return super().step(action)


make = Gated
"""


def refused(url: str) -> bool:
    """Whether a TCP connection to ``url`` is refused (rather than taken, or left waiting)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


@pytest.mark.timeout(180)
def test_a_draining_server_refuses_new_connections_at_once_instead_of_leaving_them_hanging(
    tmp_path: Path,
) -> None:
    # One process refuses new connections while it drains; N workers must too.
    # Their supervisor kept the listening socket open, so the kernel went on
    # taking connections that no worker would ever accept: a client (or a
    # ServerPool's health check) hung for the whole drain, then got a reset.
    config = "ConcurrencyConfig.from_env(max_concurrent_envs=8), shutdown_timeout=60"
    folder = write_env(tmp_path / "env", factory=GATED, config=config)
    log = folder / "serve.log"

    async def scenario(url: str, proc: subprocess.Popen[bytes]) -> None:
        await eventually(lambda: health(url).get("workers") == 2, "no workers", log)
        (client, pid), *_ = await open_sessions(url, 1)
        stepping = asyncio.ensure_future(client.step(Ping()))
        try:
            await eventually((folder / "server" / f"stepping-{pid}").exists, "no step", log)
            proc.send_signal(signal.SIGTERM)
            # The drain waits for the step, which waits for the test: still draining.
            deadline = time.monotonic() + 30
            while not await asyncio.to_thread(refused, url):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "connections still taken while draining"
                await asyncio.sleep(0.05)
        finally:
            (folder / "server" / "go").touch()
            with contextlib.suppress(Exception):  # its session ends with the drain
                await stepping
            await client.close()
        assert await asyncio.to_thread(proc.wait, 60) == 0, log.read_text()

    with serving(folder, "--workers", "2") as (url, proc), reaped(proc):
        asyncio.run(scenario(url, proc))
