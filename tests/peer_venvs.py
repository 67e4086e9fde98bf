"""Peers' real clients, each in a virtual environment of its own.

PyPI's ``openenv`` (Hugging Face's OpenEnv) imports as ``openenv`` too, and
OpenReward's SDK pins what ours cannot share, so each lives apart. ``make``
builds their venvs once from ``tests/apps/*_requirements.txt``
(``.venv-openenv-peer``, ``.venv-openreward``); without one, the test builds
a fresh venv from PyPI. An install that fails fails the test, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
APPS = ROOT / "tests" / "apps"


def pinned(requirements: Path) -> str:
    """The one ``name==version`` line of a requirements file."""
    lines = [ln.strip() for ln in requirements.read_text().splitlines()]
    return next(ln for ln in lines if ln and not ln.startswith("#"))


def peer_python(tmp_path_factory: pytest.TempPathFactory, requirements: Path, made: str) -> Path:
    """A Python with ``requirements`` installed: make's venv ``made`` if it has the
    pinned version, else a venv made now."""
    name, _, version = pinned(requirements).partition("==")
    python = ROOT / made / "bin" / "python"
    if python.exists():
        check = f"import importlib.metadata as m; print(m.version({name!r}))"
        found = subprocess.run([python, "-c", check], capture_output=True, text=True, check=False)
        if found.stdout.strip() == version:
            return python
    venv = tmp_path_factory.mktemp(made.strip("."))
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    installed = subprocess.run(
        [*pip, "-r", str(requirements)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    if installed.returncode != 0:
        pytest.fail(
            f"could not install {pinned(requirements)} from PyPI:\n{installed.stderr[-3000:]}"
        )
    return python


def run_peer_script(
    python: Path,
    script: Path,
    *args: str,
    unset: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 180,
) -> dict[str, Any]:
    """Run ``script`` with a peer's ``python`` (this checkout's ``openenv`` kept off its
    path, ``unset`` variables left out, ``env`` added) and return the JSON report it
    prints last; a failure shows its stderr."""
    environ = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", *unset}}
    environ.update(env or {})
    played = subprocess.run(
        [str(python), str(script), *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=python.parent,
        timeout=timeout,
        check=False,
    )
    assert played.returncode == 0, played.stderr[-3000:]
    report: dict[str, Any] = json.loads(played.stdout.splitlines()[-1])
    assert Path(report["module"]).is_relative_to(python.parents[1])  # the peer's own
    return report
