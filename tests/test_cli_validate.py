"""``openenv validate``: folders that are and are not environments, live and dead servers."""

from __future__ import annotations

import datetime
import importlib
import json
import os
import socket
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Literal

import pytest
from cli_envs import write_env
from pydantic import AnyUrl, BaseModel, Field
from servers import Ping
from typer.testing import CliRunner

from openenv import Action
from openenv.cli import app
from openenv.cli.validate_folder import validate_folder
from openenv.cli.validate_url import sample_action, validate_url
from openenv.testing import run_server

REPO = Path(__file__).parents[1]


def statuses(report: Any) -> dict[str, str]:
    return {check.name: check.status for check in report.checks}


def detail(report: Any, name: str) -> str:
    return next(check.detail for check in report.checks if check.name == name)


# -- folders -------------------------------------------------------------------------------


def test_the_reference_environment_passes_every_check() -> None:
    result = CliRunner().invoke(app, ["validate", str(REPO / "envs" / "echo_env")])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("✓") == 6
    assert result.stdout.strip().endswith("all checks passed")


@pytest.mark.parametrize(
    "name", sorted(p.parent.name for p in (REPO / "envs").glob("*/pyproject.toml"))
)
def test_every_reference_environment_passes_every_check(name: str) -> None:
    # Laid out as openenv init scaffolds one, envs/README.md says: benchmark_env
    # once failed, its only script named benchmark-server.
    report = validate_folder(REPO / "envs" / name)
    assert {check.name: check.status for check in report.checks if check.status != "pass"} == {}


@pytest.mark.parametrize(
    "name", sorted(p.parent.name for p in (REPO / "envs").glob("*/pyproject.toml"))
)
def test_every_reference_environment_passes_every_check_when_served(name: str) -> None:
    # wordle_env once failed "ws step": the sampled guess "x" did not match its
    # pattern. (A guess that is no word uses no try: its step_count is a warning.)
    app = importlib.import_module(f"{name}.server.app").app
    with run_server(app) as url:
        report = validate_url(url, timeout=30)
    assert {check.name: check.detail for check in report.checks if check.status == "fail"} == {}
    assert report.ok


def test_a_self_contained_folder_passes(tmp_path: Path) -> None:
    report = validate_folder(write_env(tmp_path / "env"))
    assert report.ok
    assert set(statuses(report).values()) == {"pass"}
    assert "PidEnvironment" in detail(report, "factory")


def test_a_dependency_on_pypis_openenv_is_named_for_what_it_is(tmp_path: Path) -> None:
    folder = write_env(tmp_path / "env")
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"openenv-scale>=0.1"', '"openenv>=0.1"'))
    report = validate_folder(folder)
    assert statuses(report)["pyproject"] == "fail"
    assert "Hugging Face's OpenEnv: depend on openenv-scale" in detail(report, "pyproject")


def test_a_folder_that_is_not_an_environment_fails_in_json(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    result = CliRunner().invoke(app, ["validate", str(tmp_path), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["layout"]["status"] == "fail"
    assert "missing pyproject.toml, __init__.py, server/__init__.py" in checks["layout"]["detail"]
    assert checks["app"]["status"] == "fail"
    assert "has no server/app.py" in checks["app"]["detail"]
    assert checks["factory"]["status"] == "skip"


def test_a_missing_folder_fails(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "nowhere")])
    assert result.exit_code == 1
    assert "is not a folder" in result.stdout


def test_an_instance_instead_of_a_factory_is_named(tmp_path: Path) -> None:
    folder = write_env(tmp_path / "env", factory="make = PidEnvironment()")
    report = validate_folder(folder)
    assert not report.ok
    assert statuses(report)["factory"] == "fail"
    assert "got an instance of PidEnvironment" in detail(report, "factory")
    assert statuses(report)["concurrency"] == "skip"


def test_a_factory_that_hands_out_one_shared_instance_fails(tmp_path: Path) -> None:
    shared = "_shared = PidEnvironment()\n\n\ndef make() -> PidEnvironment:\n    return _shared"
    report = validate_folder(write_env(tmp_path / "env", factory=shared))
    assert statuses(report)["app"] == "pass"
    assert statuses(report)["factory"] == "fail"
    assert "returned the same PidEnvironment twice" in detail(report, "factory")


def test_a_fresh_instance_factory_function_passes(tmp_path: Path) -> None:
    fresh = "def make() -> PidEnvironment:\n    return PidEnvironment()"
    report = validate_folder(write_env(tmp_path / "env", factory=fresh))
    assert statuses(report)["factory"] == "pass"
    assert detail(report, "factory") == "makes a new PidEnvironment per session"


def test_sharing_an_environment_not_declared_safe_fails(tmp_path: Path) -> None:
    report = validate_folder(write_env(tmp_path / "env", concurrent=False))
    assert statuses(report)["concurrency"] == "fail"
    assert "does not declare SUPPORTS_CONCURRENT_SESSIONS = True" in detail(report, "concurrency")


def test_one_session_per_process_is_consistent(tmp_path: Path) -> None:
    config = "ConcurrencyConfig.from_env(max_concurrent_envs=1)"
    report = validate_folder(write_env(tmp_path / "env", concurrent=False, config=config))
    assert report.ok
    assert "one session per process" in detail(report, "concurrency")


def test_an_app_that_ignores_the_serve_options_gets_a_warning(tmp_path: Path) -> None:
    config = "ConcurrencyConfig(max_concurrent_envs=8)"
    report = validate_folder(write_env(tmp_path / "env", config=config))
    assert report.ok  # it serves; only `openenv serve --max-sessions` cannot reach it
    assert statuses(report)["serve options"] == "warn"
    assert "ignores OPENENV_MAX_CONCURRENT_ENVS" in detail(report, "serve options")


def test_validation_ignores_the_callers_session_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENENV_MAX_CONCURRENT_ENVS", "3")
    report = validate_folder(write_env(tmp_path / "env"))
    assert "8 sessions/process" in detail(report, "concurrency")
    assert os.environ["OPENENV_MAX_CONCURRENT_ENVS"] == "3"


def test_a_broken_app_names_file_line_and_error(tmp_path: Path) -> None:
    broken = "from openenv import create_app\n\napp = create_app(Undefined, None, None)\n"
    report = validate_folder(write_env(tmp_path / "env", app=broken))
    assert detail(report, "app") == (
        "importing server/app.py:3 failed: NameError: name 'Undefined' is not defined"
    )


def test_an_app_not_made_by_create_app_fails(tmp_path: Path) -> None:
    plain = "from fastapi import FastAPI\n\napp = FastAPI()\n\n\ndef main() -> None:\n    pass\n"
    report = validate_folder(write_env(tmp_path / "env", app=plain))
    assert statuses(report) == {
        "layout": "pass",
        "pyproject": "pass",
        "app": "fail",
        "factory": "skip",
        "concurrency": "skip",
        "serve options": "skip",
    }


def test_an_app_that_exits_does_not_end_the_validation(tmp_path: Path) -> None:
    exits = "import sys\n\nsys.exit(3)\n"
    report = validate_folder(write_env(tmp_path / "env", app=exits))
    assert detail(report, "app") == "importing server/app.py:3 failed: SystemExit: 3"


def test_an_uninstalled_package_says_how_to_install_it(tmp_path: Path) -> None:
    uses_package = "from inline_env.models import Ping\n"
    folder = write_env(tmp_path / "env", app=uses_package)
    report = validate_folder(folder)
    assert detail(report, "app") == (
        f"server/app.py imports inline_env, which is not installed in this Python "
        f"({sys.executable}); run: pip install -e {folder.resolve()}"
    )


def test_a_wrong_entry_point_fails(tmp_path: Path) -> None:
    folder = write_env(tmp_path / "env")
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("server.app:main", "app:main"))
    report = validate_folder(folder)
    assert statuses(report)["pyproject"] == "fail"
    assert 'needs server = "inline_env.server.app:main"' in detail(report, "pyproject")


SCRIPTS = '[project.scripts]\nserver = "inline_env.server.app:main"\n'
DEPENDENCIES = 'dependencies = ["openenv-scale>=0.1"]'


@pytest.mark.parametrize(
    ("edits", "problem"),
    [
        (
            [("[project.scripts]", "[other.scripts]"), ("[project]", 'project = "x"\n[other]')],
            "has no [project] name",
        ),
        (
            [(SCRIPTS, ""), (DEPENDENCIES, DEPENDENCIES + '\nscripts = "server"')],
            'needs server = "inline_env.server.app:main" (found None)',
        ),
        ([("package-dir = {", "package-dir = [{"), ('"server" }', '"server" }]')], "package-dir"),
        ([(DEPENDENCIES, 'dependencies = [1, "openenv-scale>=0.1"]')], "list of strings"),
    ],
)
def test_a_pyproject_with_a_value_of_the_wrong_shape_fails_its_check(
    tmp_path: Path, edits: list[tuple[str, str]], problem: str
) -> None:
    folder = write_env(tmp_path / "env")
    pyproject = folder / "pyproject.toml"
    text = pyproject.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    pyproject.write_text(text)
    result = CliRunner().invoke(app, ["validate", str(folder), "--json"])
    # A failed check, not a traceback.
    assert not isinstance(result.exception, Exception), result.exception
    assert result.exit_code == 1
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert checks["pyproject"]["status"] == "fail"
    assert problem in checks["pyproject"]["detail"]


def test_folders_are_imported_in_isolation(tmp_path: Path) -> None:
    first = validate_folder(write_env(tmp_path / "a"))
    second = validate_folder(write_env(tmp_path / "b", concurrent=False))
    assert first.ok
    assert statuses(second)["concurrency"] == "fail"  # not the first folder's cached app
    assert "server" not in sys.modules


# -- servers -------------------------------------------------------------------------------


def test_a_live_server_passes_with_a_real_episode(echo_url: str) -> None:
    result = CliRunner().invoke(app, ["validate", "--url", echo_url, "--json"])
    assert result.exit_code == 0, result.output
    checks = json.loads(result.stdout)["checks"]
    assert [c["name"] for c in checks] == [
        "/health",
        "/metadata",
        "/schema",
        "ws reset",
        "ws step",
        "ws state",
        "ws close",
    ]
    assert {c["status"] for c in checks} == {"pass"}
    assert checks[4]["detail"] == 'action {"message": "x"} -> reward 0.1, done False'


def test_nothing_listening_is_one_clear_failure() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    result = CliRunner().invoke(app, ["validate", "--url", url])
    assert result.exit_code == 1
    assert f"/health     nothing is listening at {url} (connection refused)" in result.stdout
    assert result.stdout.count("the server is unreachable") == 3


def test_a_server_that_never_answers_fails_within_the_timeout() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()  # connections complete in the kernel; nobody ever answers
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        report = validate_url(url, timeout=0.3)
    assert statuses(report) == {
        "/health": "fail",
        "/metadata": "skip",
        "/schema": "skip",
        "ws episode": "skip",
    }
    assert detail(report, "/health") == f"no answer from {url} within 0.3s"


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "BadStatusLine('SSH-2.0-OpenSSH_9.6\\r\\n')"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",
            "IncompleteRead(2 bytes read, 98 more expected)",
        ),
    ],
    ids=["another-protocol", "cut-short"],
)
def test_a_port_that_does_not_speak_http_is_one_clear_failure(answer: bytes, said: str) -> None:
    # The wrong port (ssh, a database) once ended the command in a traceback.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"

        def answer_once() -> None:
            connection, _ = sock.accept()
            with connection:
                connection.sendall(answer)
                connection.shutdown(socket.SHUT_WR)
                connection.recv(65536)

        server = threading.Thread(target=answer_once)
        server.start()
        result = CliRunner().invoke(app, ["validate", "--url", url, "--json"])
        server.join()
    assert not isinstance(result.exception, Exception), result.exception
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert checks["/health"] == {
        "name": "/health",
        "status": "fail",
        "detail": f"{url} does not answer as an HTTP server: {said}",
    }
    assert [checks[n]["status"] for n in ("/metadata", "/schema", "ws episode")] == ["skip"] * 3


def test_an_environment_error_during_the_episode_is_reported() -> None:
    from openenv import Observation, State, create_app
    from openenv.environment import Environment

    class Broken(Environment[Ping, Observation, State]):
        def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Any:
            return Observation()

        def step(self, action: Ping, **kwargs: Any) -> Observation:
            raise RuntimeError("the simulator crashed")

        @property
        def state(self) -> State:
            return State()

    with run_server(create_app(Broken, Ping, Observation)) as url:
        report = validate_url(url)
    assert statuses(report)["ws step"] == "fail"
    assert "EnvExecutionError" in detail(report, "ws step")
    # The exception's type; its text stays in the server's log.
    assert "step() raised RuntimeError" in detail(report, "ws step")
    assert statuses(report)["ws state"] == "skip"


def test_a_bad_url_is_a_failed_check() -> None:
    result = CliRunner().invoke(app, ["validate", "--url", "ftp://example.com"])
    assert result.exit_code == 1
    assert "isn't a valid environment URL" in result.stdout


def test_a_folder_and_a_url_together_are_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(tmp_path), "--url", "http://x:1"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: give a folder or --url, not both"


# -- actions built from schemas ------------------------------------------------------------


class Inner(BaseModel):
    level: int = Field(ge=2, multiple_of=2)


class Everything(Action):
    name: str = Field(min_length=3)
    mode: Literal["fast", "slow"]
    ratio: float = Field(gt=0.5, lt=1)
    count: int = Field(le=-3)
    tags: list[str] = Field(min_length=1)
    inner: Inner
    maybe: int | None
    flag: bool
    optional: str = "left out"


class Node(BaseModel):
    value: int
    next: Node | None  # required, and the model within itself: once a RecursionError


class Push(Action):
    head: Node


class Guess(Action):
    word: str = Field(pattern="^[A-Za-z]{5}$")  # wordle's: "x" was sent, and refused


class Place(Action):
    cell: tuple[int, str, float]  # once [{}, {}, {}]: prefixItems went unread


class Meeting(Action):
    # Strings of a format: "x" was sent for each, and refused.
    when: datetime.datetime
    day: datetime.date
    at: datetime.time
    lasts: datetime.timedelta
    room: uuid.UUID
    link: AnyUrl


@pytest.mark.parametrize("model", [Everything, Ping, Inner, Push, Guess, Place, Meeting])
def test_sample_actions_validate_against_their_model(model: type[BaseModel]) -> None:
    action = sample_action(model.model_json_schema())
    model.model_validate(action)
    assert "optional" not in action
