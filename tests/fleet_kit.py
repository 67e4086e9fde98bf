"""What the fleet tests share: the environment folders and polling the directory."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ECHO = Path(__file__).parents[1] / "envs" / "echo_env"
COUNTER = ECHO.parent / "counter_env"


def until(condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds}s"
        time.sleep(0.1)


def healthy(url: str) -> list[dict[str, Any]]:
    replicas: list[dict[str, Any]] = httpx.get(f"{url}/replicas").json()["replicas"]
    return [r for r in replicas if r["status"] == "healthy"]
