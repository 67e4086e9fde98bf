"""Every reference environment's README, followed as written: its ``uvicorn
server.app:app`` command run from its folder, then each of its Python examples in a
fresh interpreter against that server, printing what its ``# comments`` say.

Some environments' own tests run their example against an app imported in the test
process; this runs each one the way its README tells a reader to, so a README whose
command or example no longer works (an env without one of its own tests included)
fails here.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dockerfiles import free_port, stop, wait_healthy
from readme_blocks import expected_output

ENVS = Path(__file__).parents[1] / "envs"
READMES = sorted(ENVS.glob("*/README.md"))
BIN = Path(sys.executable).parent


def serve_command(readme: str) -> list[str]:
    """The README's ``uvicorn server.app:app ...`` command in its Serve section (a
    command line, or inline in the text), serving on port 8000 as the examples expect."""
    serve = readme.split("\n## Serve\n", 1)[1].split("\n## ", 1)[0]
    (line, *_) = re.findall(r"(uvicorn server\.app:app\b[^`#\n]*)", serve)
    command = shlex.split(line)
    return command if "--port" in command else [*command, "--port", "8000"]  # uvicorn's default


@pytest.fixture(params=READMES, ids=lambda readme: readme.parent.name)
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """The README's environment, served by its README's command from its folder."""
    readme: Path = request.param
    command = serve_command(readme.read_text())
    assert command[command.index("--port") + 1] == "8000", command  # what the examples use
    port = free_port()
    command[command.index("--port") + 1] = str(port)
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / command[0]), *command[1:]],
            cwd=readme.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        yield readme, f"127.0.0.1:{port}"
    finally:
        stop(proc)


def test_the_readme_serves_and_its_examples_run_as_written(served: tuple[Path, str]) -> None:
    readme, address = served
    examples = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.DOTALL)
    assert examples, f"{readme} has no Python example"
    for code in examples:
        code = code.replace("localhost:8000", address).replace("127.0.0.1:8000", address)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"{readme}:\n{code}\n{done.stderr}"
        printed = done.stdout.splitlines()
        for line in expected_output(code):
            assert line in printed, f"{readme}: {line!r} not printed; it printed {printed}"
