"""Every command's refusal is one plain line on stderr, whatever reads it (a pipe, a CI log)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

OPENENV = Path(sys.executable).with_name("openenv")


def openenv(*args: str) -> subprocess.CompletedProcess[str]:
    """The real ``openenv`` script, its output read through pipes (not a terminal)."""
    return subprocess.run(
        [OPENENV, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port held by a socket that does not listen: connections are refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def test_bench_says_an_unreachable_server_in_one_unwrapped_line(closed_port: int) -> None:
    # Long enough that rich would wrap it at 80 columns; brackets rich would take for a style.
    url = f"http://127.0.0.1:{closed_port}/a/path/[bold]/long/enough/to/pass/eighty/columns"
    result = openenv("bench", url, "--steps", "1")
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    assert result.stderr.startswith(f"error: cannot connect to {url}: ")
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_run_says_a_bad_url_in_one_unwrapped_line() -> None:
    result = openenv("run", "--env", "localhost:8000/[env]", "--no-progress")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "error: 'localhost:8000/[env]' isn't a valid environment URL; "
        "use http://host:port, https://..., ws://... or wss://...\n"
    )


def test_demo_refuses_an_app_dir_that_is_not_there(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = openenv("demo", "--app-dir", str(missing), "--sessions", "1", "--steps", "1")
    assert result.returncode == 2, result.stderr
    assert "does not exist" in result.stderr
    assert result.stdout == ""  # refused before any server started
