"""The README's example runs as written, against a real server."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import sys
from pathlib import Path

from openenv.testing import run_server

README = Path(__file__).parents[1] / "README.md"


def _python_blocks(section: str | None = None) -> list[str]:
    text = README.read_text()
    if section is not None:
        text = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_readme_environment_serves_and_its_client_plays(tmp_path: Path) -> None:
    env_code, client_code = _python_blocks()[:2]
    (tmp_path / "my_env.py").write_text(env_code)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("my_env")
        with run_server(module.app) as url:
            code = client_code.replace("http://localhost:8000", url)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_env", None)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("mean steps to solve: ")
    assert 1 <= float(lines[0].split(": ")[1]) <= 7  # binary search over 100 numbers
    assert lines[1] == "lower"


def _run_against_the_readme_env(tmp_path: Path, section: str) -> list[str]:
    """Run the first Python block of ``section`` against the README's environment;
    its printed lines."""
    env_code, code = _python_blocks()[0], _python_blocks(section)[0]
    (tmp_path / "my_env.py").write_text(env_code)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("my_env")
        with run_server(module.app) as url:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = code.replace("http://localhost:8000", url)
                exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_env", None)
    return out.getvalue().splitlines()


def test_readme_runs_many_episodes(tmp_path: Path) -> None:
    lines = _run_against_the_readme_env(tmp_path, "Run many episodes")
    assert lines == ["550 ok, target of t7: 7"]


def test_readme_steps_many_sessions_over_one_connection(tmp_path: Path) -> None:
    lines = _run_against_the_readme_env(tmp_path, "Many sessions per connection")
    assert lines == ["solved at once: 3.0"]
