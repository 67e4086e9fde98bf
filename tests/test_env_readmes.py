"""echo_env's README example prints what its comments say, against a real server."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from readme_blocks import expected_output, python_block

README = Path(__file__).parents[1] / "envs" / "echo_env" / "README.md"


def test_the_echo_env_readme_example_runs_as_written(echo_url: str) -> None:
    code = python_block(README)
    assert expected_output(code) == ["hello 0.5", "2"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace("http://127.0.0.1:8000", echo_url), str(README), "exec"), {})
    assert out.getvalue().splitlines() == expected_output(code)
