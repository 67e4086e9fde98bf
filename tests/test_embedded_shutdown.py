"""Shutting down a server embedded in a Python program while a ``def`` step never returns.

``openenv.serve`` in the program's main thread, and ``openenv.testing.run_server``
around the program's own code: on SIGTERM or SIGINT the stuck session is
abandoned after ``shutdown_timeout``, the call returns, the program goes on,
and the thread still stuck in the step does not hold the interpreter's exit.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from websockets.sync.client import ClientConnection, connect

from openenv.client import ws_url

HOST = """
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from openenv import Action, Environment, Observation, State, create_app, serve
from openenv.testing import run_server

STEPPING = Path(sys.argv[2])


class Hang(Action):
    pass


class Nothing(Observation):
    pass


class Stuck(Environment[Hang, Nothing, State]):
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Nothing:
        return Nothing()

    def step(self, action: Hang, **kwargs: Any) -> Nothing:
        STEPPING.touch()
        time.sleep(10**6)  # never returns
        return Nothing()

    @property
    def state(self) -> State:
        return State()


app = create_app(Stuck, Hang, Nothing, shutdown_timeout=1)

if sys.argv[1] == "run_server":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # this program's choice
    try:
        with run_server(app) as url:
            print(url, flush=True)
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
else:
    serve(app, port=int(sys.argv[3]), log_level="warning")
print("the program goes on", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _connect(url: str, proc: subprocess.Popen[str]) -> ClientConnection:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            return connect(ws_url(url))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def _program(tmp_path: Path, entry: str) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    script = tmp_path / "host.py"
    script.write_text(HOST)
    stepping = tmp_path / "stepping"
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(script), entry, str(stepping), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = (
            proc.stdout.readline().strip() if entry == "run_server" else f"http://127.0.0.1:{port}"
        )
        yield proc, url, stepping
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("entry", ["serve", "run_server"])
def test_a_stuck_step_does_not_hold_an_embedded_servers_shutdown(
    tmp_path: Path, entry: str, sig: int
) -> None:
    with _program(tmp_path, entry) as (proc, url, stepping), _connect(url, proc) as ws:
        ws.send('{"type": "reset"}')
        ws.recv(30)
        ws.send('{"type": "step", "data": {}}')
        deadline = time.monotonic() + 30
        while not stepping.exists():
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.02)
        proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=60)  # a bound on failure, not a measure
        except subprocess.TimeoutExpired:
            pytest.fail("the program did not exit after the signal")
    assert (proc.returncode, out.splitlines()[-1:]) == (0, ["the program goes on"]), err
    assert "abandoning it without close()" in err
