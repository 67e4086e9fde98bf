from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


from echo_env.server.app import app as echo_app
from openenv.testing import run_server

# Apps that the tests start in their own processes, with their own settings.
collect_ignore = ["apps"]


@pytest.fixture(scope="session")
def echo_url() -> Iterator[str]:
    """One echo server for the whole test session."""
    with run_server(echo_app) as url:
        yield url


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace: dict[str, object]) -> None:
    doctest_namespace["ECHO_URL"] = "http://127.0.0.1:8000"
