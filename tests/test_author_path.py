"""An environment author's path, end to end, in a fresh virtual environment.

One virtual environment is made for the module by playing the top-level
Dockerfile's build steps in it: openenv is built into a wheel from this
checkout and installed (not editable) together with echo_env. Everything
below runs the commands an author would type, as subprocesses of that venv.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from dockerfiles import Image, build, expanded, stop, wait_healthy
from readme_blocks import expected_output, python_block

from coding_env import CodeAction, CodingEnv
from echo_env import EchoAction, EchoEnv

REPO = Path(__file__).parents[1]
DEFAULT_URL = "http://127.0.0.1:8000"
# Building the image venv installs openenv's dependencies; a loaded machine needs a while.
pytestmark = pytest.mark.timeout(300)

CLIENT = """
import sys
from my_env import MyAction, MyEnv

with MyEnv(sys.argv[1]).sync() as env:
    result = env.reset(seed=int(sys.argv[2]))
    low, high = 0, 99
    while not result.done:
        guess = (low + high) // 2
        result = env.step(MyAction(guess=guess))
        low, high = (guess + 1, high) if result.observation.hint == "higher" else (low, guess - 1)
    print(result.observation.hint, result.reward, env.state().step_count)
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    root = tmp_path_factory.mktemp("image-root")
    return build(REPO / "Dockerfile", REPO, root, venv)


def run(image: Image, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command of the fresh venv (``openenv``, ``python``, ``pip``) in ``cwd``."""
    command = [str(image.venv / "bin" / str(args[0])), *map(str, args[1:])]
    return subprocess.run(
        command, cwd=cwd, env=image.environ(), capture_output=True, text=True, check=False
    )


@contextlib.contextmanager
def openenv_serve(image: Image, *args: str, cwd: Path) -> Iterator[tuple[str, str]]:
    """``openenv serve ... --port 0``; yield the URL it prints and its first line."""
    log, out = cwd / "serve.log", cwd / "serve.out"
    with log.open("wb") as err, out.open("wb") as stdout:
        proc = subprocess.Popen(
            [str(image.venv / "bin" / "openenv"), "serve", *args, "--port", "0"],
            cwd=cwd,
            env=image.environ(),
            stdout=stdout,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not (match := re.search(r"at (http://\S+) \(", out.read_text())):
            assert proc.poll() is None, f"openenv serve exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"openenv serve printed no URL: {log.read_text()}"
            time.sleep(0.05)
        url = match.group(1)
        wait_healthy(url, proc, log)
        yield url, out.read_text().splitlines()[0]
    finally:
        # Ctrl+C, as an author would stop it: a graceful shutdown and exit code 0.
        assert stop(proc, signal.SIGINT) == 0, log.read_text()
        assert "Application shutdown complete" in log.read_text()


def test_the_wheel_carries_the_template(image: Image, tmp_path: Path) -> None:
    code = "from openenv.cli.scaffold import template_dir; print(template_dir())"
    where = run(image, "python", "-c", code, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(image.venv)
    direct_url = run(image, "pip", "show", "--files", "openenv-scale", cwd=tmp_path)
    assert "openenv/templates/env/server/Dockerfile" in direct_url.stdout


def test_init_install_validate_serve_play_and_test(image: Image, tmp_path: Path) -> None:
    created = run(image, "openenv", "init", "my_env", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    assert created.stdout.splitlines()[-5:] == [
        "  pip install -e 'my_env[test]'",
        "  openenv validate my_env",
        "  pytest my_env",
        "  openenv serve my_env",
        "  openenv validate --url http://127.0.0.1:8000",
    ]
    folder = tmp_path / "my_env"

    installed = run(image, "pip", "install", "-e", f"{folder}[test]", cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    # Installed in editable mode, the name is taken by this very folder: refreshing it is fine.
    refreshed = run(image, "openenv", "init", "my_env", "--force", cwd=tmp_path)
    assert refreshed.returncode == 0, refreshed.stderr

    checked = run(image, "openenv", "validate", "my_env", "--json", cwd=tmp_path)
    report = json.loads(checked.stdout)
    assert checked.returncode == 0, report
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        "layout": "pass",
        "pyproject": "pass",
        "app": "pass",
        "factory": "pass",
        "concurrency": "pass",
        "serve options": "pass",
    }

    with openenv_serve(image, "my_env", "--max-sessions", "8", cwd=tmp_path) as (url, line):
        assert line.startswith(f"serving MyEnvironment from my_env at {url} (up to 8 sessions)")
        live = run(image, "openenv", "validate", "--url", url, cwd=tmp_path)
        assert live.returncode == 0, live.stdout
        assert "all checks passed" in live.stdout
        assert "✗" not in live.stdout
        with urllib.request.urlopen(f"{url}/health") as response:
            assert json.load(response)["max_sessions"] == 8

        example = python_block(folder / "README.md")
        documented = run(image, "python", "-c", example.replace(DEFAULT_URL, url), cwd=tmp_path)
        assert documented.returncode == 0, documented.stderr
        assert documented.stdout.splitlines() == expected_output(example)

        played = run(image, "python", "-c", CLIENT, url, "7", cwd=tmp_path)
        assert played.returncode == 0, played.stderr
        hint, reward, steps = played.stdout.split()
        assert (hint, reward) == ("correct", "1.0")
        assert 1 <= int(steps) <= 7

    tested = run(image, "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=folder)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert re.search(r"\b3 passed\b", tested.stdout)


def test_the_image_serves_echo_env_as_a_non_root_user(image: Image, tmp_path: Path) -> None:
    assert image.base.startswith("python:3.11")
    assert image.user is not None
    assert image.user.isdigit()  # numeric: Kubernetes can check runAsNonRoot
    assert int(image.user) != 0
    assert image.exposed == ["8000"]
    assert image.cmd[0] == "uvicorn"  # exec form, no shell in between
    assert image.workdir == image.root / "app" / "env"
    log = tmp_path / "image.log"
    with image.running(log) as (url, proc):
        assert image.run_healthcheck(url) == 0
        with EchoEnv(url).sync() as env:
            env.reset()
            assert env.step(EchoAction(message="hello")).reward == 0.5
        # `docker stop` sends SIGTERM to PID 1, uvicorn itself: it shuts down gracefully,
        # then re-raises the signal, as uvicorn does.
        assert stop(proc) == -signal.SIGTERM
    assert "Application shutdown complete" in log.read_text()
    assert image.run_healthcheck(url) != 0


def test_the_build_arg_picks_another_environment() -> None:
    assert "envs/echo_env ./env" in expanded(REPO / "Dockerfile", "COPY")
    assert "envs/my_env ./env" in expanded(REPO / "Dockerfile", "COPY", {"ENV_NAME": "my_env"})


def test_the_template_dockerfile_installs_and_serves_a_new_environment(
    image: Image, tmp_path: Path
) -> None:
    assert run(image, "openenv", "init", "boxed_env", cwd=tmp_path).returncode == 0
    folder = tmp_path / "boxed_env"
    boxed = build(folder / "server" / "Dockerfile", folder, tmp_path / "root", image.venv)
    assert boxed.user is not None
    assert boxed.user.isdigit()  # numeric: Kubernetes can check runAsNonRoot
    assert int(boxed.user) != 0
    assert boxed.exposed == ["8000"]
    assert boxed.cmd == ["uvicorn", "server.app:app"]
    with boxed.running(tmp_path / "boxed.log") as (url, _):
        assert boxed.run_healthcheck(url) == 0
        live = run(image, "openenv", "validate", "--url", url, cwd=tmp_path)
        assert live.returncode == 0, live.stdout
        assert "BoxedEnvironment" in live.stdout


PERMISSION_PROBE = """
import os
try:
    os.kill({pid}, 0)  # signal 0: the permission check alone
except PermissionError:
    print("refused")
else:
    print("allowed")
"""


def test_the_coding_env_image_runs_each_program_under_a_uid_of_its_own(
    image: Image, tmp_path: Path
) -> None:
    # With USER 10001, as every other image, the sandbox had no uids to give:
    # programs ran as the server's user, could signal it (PID 1) and read its files.
    folder = REPO / "envs" / "coding_env"
    boxed = build(folder / "server" / "Dockerfile", folder, tmp_path / "root", image.venv)
    assert boxed.user is None  # root, which programs never are
    with boxed.running(tmp_path / "coding.log") as (url, proc):
        assert boxed.run_healthcheck(url) == 0
        with CodingEnv(url).sync() as env:
            env.reset(seed=0)
            result = env.step(CodeAction(code=PERMISSION_PROBE.format(pid=proc.pid)))
        execution = result.observation.execution
        assert execution is not None
        assert (execution.status, execution.stdout) == ("ok", "refused\n"), execution
