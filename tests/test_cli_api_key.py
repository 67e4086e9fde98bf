"""``openenv validate --url``, ``run`` and ``bench`` against a server that needs an API key.

Every route but ``/health`` needs it; the commands send ``$OPENENV_API_KEY`` on
their HTTP requests as on their WebSocket handshakes, and without it say so in
one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, create_app
from openenv.testing import run_server

OPENENV = Path(sys.executable).with_name("openenv")
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    config = ConcurrencyConfig(max_concurrent_envs=8)
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, config, api_key=KEY)
    with run_server(app) as url:
        yield url


def openenv(*args: str, key: str | None) -> subprocess.CompletedProcess[str]:
    environ = {name: value for name, value in os.environ.items() if name != "OPENENV_API_KEY"}
    if key is not None:
        environ["OPENENV_API_KEY"] = key
    return subprocess.run(
        [OPENENV, *args], capture_output=True, text=True, timeout=120, env=environ, check=False
    )


def checks(result: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    report = json.loads(result.stdout)
    return {c["name"]: (c["status"], c["detail"]) for c in report["checks"]}


def test_validate_sends_the_key_to_every_route(keyed_url: str) -> None:
    result = openenv("validate", "--url", keyed_url, "--json", key=KEY)
    assert result.returncode == 0, result.stdout
    assert {status for status, _ in checks(result).values()} == {"pass"}


@pytest.mark.parametrize(("key", "said"), [(None, "missing API key"), ("nope", "wrong API key")])
def test_validate_without_the_right_key_says_which_key(
    keyed_url: str, key: str | None, said: str
) -> None:
    result = openenv("validate", "--url", keyed_url, "--json", key=key)
    assert result.returncode == 1
    found = checks(result)
    assert found["/health"][0] == "pass"  # /health is open to anyone
    assert found["/metadata"] == (
        "fail",
        f"GET /metadata: HTTP 401 {said}; set OPENENV_API_KEY to the server's key",
    )


def test_run_with_the_key_plays_its_episodes(keyed_url: str) -> None:
    # RandomAgent fetches /schema for its actions: that request needs the key too.
    result = openenv("run", "--env", keyed_url, "--tasks", "3", "--no-progress", key=KEY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 (3 ok, 0 error, 0 timeout)" in result.stdout


@pytest.mark.parametrize("client", ["websockets", "picows"])
def test_bench_sends_the_key_on_every_session(keyed_url: str, client: str) -> None:
    args = ("bench", keyed_url, "-c", "2", "--steps", "3", "--client", client, "--json")
    result = openenv(*args, key=KEY)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["sessions_ok"], report["steps"]) == (2, 6), report


def test_bench_without_the_key_is_one_error_before_any_load(keyed_url: str) -> None:
    result = openenv("bench", keyed_url, "--steps", "1", key=None)
    assert (result.returncode, result.stdout) == (1, ""), result.stdout
    assert result.stderr == (
        f"error: cannot connect to {keyed_url}: missing API key; "
        f"set OPENENV_API_KEY to the server's key\n"
    )


@pytest.mark.parametrize("key", ["clé-secrète", " padded-secret", "tab\tsecret"])
def test_a_key_no_client_could_send_is_refused_at_start_without_being_shown(key: str) -> None:
    # Clients send the key in an HTTP header: one that is not printable ASCII,
    # or has spaces around it, could never match, so every request would be
    # refused. It is refused at start instead, naming the setting, not the key.
    with pytest.raises(ValueError, match="api_key") as refused:
        create_app(EchoEnvironment, EchoAction, EchoObservation, api_key=key)
    assert "secr" not in str(refused.value)
    echo = Path(__file__).parents[1] / "envs" / "echo_env"
    served = openenv("serve", str(echo), "--port", "0", key=key)
    assert served.returncode == 1
    assert "api_key" in served.stderr
    assert "printable ASCII" in served.stderr
    assert "secr" not in served.stderr + served.stdout
