"""docs/tutorial.md, followed as written on a freshly scaffolded environment."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from openenv.testing import run_server

TUTORIAL = Path(__file__).parents[1] / "docs" / "tutorial.md"
BIN = Path(sys.executable).parent


def blocks(section: str) -> list[str]:
    text = TUTORIAL.read_text().split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``openenv init guess_env`` in an empty folder, importable from this process."""
    folder = tmp_path_factory.mktemp("tutorial")
    subprocess.run([BIN / "openenv", "init", "guess_env"], cwd=folder, check=True)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        for name in [m for m in sys.modules if m == "guess_env" or m.startswith("guess_env.")]:
            del sys.modules[name]


def run(code: str, cwd: Path) -> list[str]:
    out = io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(TUTORIAL), "exec"), {"__name__": "tutorial"})
    finally:
        os.chdir(here)
    return out.getvalue().splitlines()


def test_step_2_checks_pass_on_the_scaffold(scaffold: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(scaffold)}
    for command in (["openenv", "validate", "guess_env"], ["pytest", "-q", "guess_env"]):
        done = subprocess.run(
            [BIN / command[0], *command[1:]], cwd=scaffold, env=env, capture_output=True
        )
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_step_4_drives_the_served_environment(scaffold: Path) -> None:
    (code,) = blocks("4. Drive it from code")
    app = importlib.import_module("guess_env.server.app").app
    with run_server(app) as url:
        lines = run(code.replace("http://127.0.0.1:8000", url), scaffold)
    assert lines == ["lower 6"]


def test_step_5_plays_and_records_many_episodes(scaffold: Path) -> None:
    from openenv.trajectories import load

    (code,) = blocks("5. Play many episodes")
    assert run(code, scaffold) == ["1.0"]
    assert len(load(scaffold / "runs" / "bisect")) == 200


def test_step_6_training_finds_bisection(scaffold: Path) -> None:
    (code,) = blocks("6. Train against it")
    lines = run(code, scaffold)
    assert lines[-1] == "round 20: success 100%, favourite fraction 0.5"
    first = int(lines[0].split("success ")[1].split("%")[0])
    assert first < 100  # it starts out worse than it ends: it learned
