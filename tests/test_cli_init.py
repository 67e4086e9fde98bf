"""``openenv init``: names, existing folders, what the template renders to, and --help."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from openenv.cli import app
from openenv.cli.scaffold import init_env, render_template, template_dir

REPO = Path(__file__).parents[1]
ECHO = REPO / "envs" / "echo_env"
# Build artefacts of an installed environment, not part of its layout.
ARTEFACTS = {"build", "__pycache__", "echo_env.egg-info", ".pytest_cache", ".ruff_cache"}


def files(folder: Path) -> set[str]:
    return {
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and not ARTEFACTS.intersection(path.relative_to(folder).parts)
    }


def test_init_creates_the_environment_and_prints_the_next_commands(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["init", "grid_world", "--output-dir", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "a" / "grid_world"
    assert files(folder) == {
        ".dockerignore",
        "README.md",
        "__init__.py",
        "client.py",
        "models.py",
        "pyproject.toml",
        "server/Dockerfile",
        "server/__init__.py",
        "server/app.py",
        "server/environment.py",
        "tests/test_grid_world.py",
    }
    assert result.stdout.splitlines()[-5:] == [
        f"  pip install -e '{folder}[test]'",
        f"  openenv validate {folder}",
        f"  pytest {folder}",
        f"  openenv serve {folder}",
        "  openenv validate --url http://127.0.0.1:8000",
    ]
    pyproject = tomllib.loads((folder / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {"server": "grid_world.server.app:main"}
    app_py = (folder / "server" / "app.py").read_text()
    assert "from grid_world.server.environment import GridWorldEnvironment" in app_py
    assert "class GridWorldEnv(EnvClient[GridWorldAction" in (folder / "client.py").read_text()


def test_the_next_commands_paste_into_a_shell_whatever_the_folder_is_called(
    tmp_path: Path,
) -> None:
    # Once printed unquoted: `openenv validate My Projects/my_env` is two arguments.
    output = tmp_path / "My Projects" / "it's here"
    result = CliRunner().invoke(app, ["init", "my_env", "--output-dir", str(output)])
    assert result.exit_code == 0, result.output
    folder = str(output / "my_env")
    commands = [shlex.split(line) for line in result.stdout.splitlines()[-5:]]
    assert commands[:4] == [
        ["pip", "install", "-e", f"{folder}[test]"],
        ["openenv", "validate", folder],
        ["pytest", folder],
        ["openenv", "serve", folder],
    ]
    # Validated before it is installed: the folder is found, and the command that
    # installs it pastes as well.
    validated = CliRunner().invoke(app, [*commands[1][1:], "--json"])
    checks = {check["name"]: check for check in json.loads(validated.stdout)["checks"]}
    assert checks["layout"]["status"] == "pass"
    hint = checks["app"]["detail"].partition("; run: ")[2]
    assert shlex.split(hint) == ["pip", "install", "-e", folder]


def test_no_placeholder_survives_rendering(tmp_path: Path) -> None:
    folder = init_env("leak_check", tmp_path)
    for path in folder.rglob("*"):
        assert "__env_name__" not in path.name
        if path.is_file():
            text = path.read_text()
            assert "__env_name__" not in text, path
            assert "__Prefix__" not in text, path


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("My-Env", "is not a valid environment name: use a lowercase Python identifier"),
        ("my env", "Did you mean 'my_env'?"),
        ("café_world", "Did you mean 'cafe_world'?"),  # once 'caf_world'
        ("3d_world", "Did you mean 'env_3d_world'?"),
        ("_private", "starting with a letter"),
        ("", "is not a valid environment name"),
        ("class", "is a Python keyword"),
        ("json", "would shadow Python's own json module"),
        ("openenv", "would shadow openenv's openenv module"),
        ("server", "would shadow openenv's server module"),
        ("pydantic", "'pydantic' is already installed here (pydantic); an environment of that"),
        ("echo_env", "pick another name, e.g. 'echo_env_env'"),
        ("models", "'models' would shadow the environment's own models.py"),
        ("client", "'client' would shadow the environment's own client.py"),
        ("tests", "'tests' would shadow the environment's own tests/ folder"),
        # Once half written: tests/test_NAME.py was too long a file name to create.
        ("a" * 250, "is 250 characters long; pick a name of at most 100"),
    ],
)
def test_bad_names_are_refused_in_one_line(tmp_path: Path, name: str, message: str) -> None:
    result = CliRunner().invoke(app, ["init", name, "--output-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_refused_unless_forced(tmp_path: Path) -> None:
    folder = init_env("my_env", tmp_path)
    (folder / "models.py").write_text("# my own work\n")
    (folder / "notes.txt").write_text("keep me\n")

    refused = CliRunner().invoke(app, ["init", "my_env", "--output-dir", str(tmp_path)])
    assert refused.exit_code == 1
    assert refused.stderr.strip() == (
        f"error: {folder} already exists; pass --force to overwrite its files"
    )
    assert (folder / "models.py").read_text() == "# my own work\n"

    forced = CliRunner().invoke(app, ["init", "my_env", "-o", str(tmp_path), "--force"])
    assert forced.exit_code == 0, forced.output
    assert "class MyAction(Action)" in (folder / "models.py").read_text()
    assert (folder / "notes.txt").read_text() == "keep me\n"


def test_a_file_in_the_way_is_refused_even_when_forced(tmp_path: Path) -> None:
    (tmp_path / "my_env").write_text("")
    result = CliRunner().invoke(app, ["init", "my_env", "-o", str(tmp_path), "--force"])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {tmp_path / 'my_env'} exists and is not a folder"


@pytest.mark.parametrize(
    ("in_the_way", "message"),
    [
        ("tests", "tests is a file where the template has a folder"),
        ("server/app.py/", "server/app.py is a folder where the template has a file"),
    ],
)
def test_a_forced_init_meeting_something_in_the_way_writes_nothing(
    tmp_path: Path, in_the_way: str, message: str
) -> None:
    # Once found half-way: README, models and client were overwritten, then
    # "[Errno 17] File exists".
    folder = tmp_path / "my_env"
    folder.mkdir()
    (folder / "README.md").write_text("mine")
    obstacle = folder / in_the_way
    if in_the_way.endswith("/"):
        obstacle.mkdir(parents=True)
    else:
        obstacle.write_text("mine")
    result = CliRunner().invoke(app, ["init", "my_env", "-o", str(tmp_path), "--force"])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {folder}: {message}"
    assert (folder / "README.md").read_text() == "mine"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["README.md", in_the_way.split("/")[0]]
    )


def test_the_rendered_code_passes_ruff_in_its_own_project(tmp_path: Path) -> None:
    folder = init_env("tidy_env", tmp_path)
    ruff = Path(sys.executable).with_name("ruff")
    # Run from the new folder, so ruff reads the generated pyproject.toml and nothing of ours.
    for command in (["check", "."], ["format", "--check", "."]):
        done = subprocess.run([ruff, *command], cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_rendered_code_type_checks_strictly(tmp_path: Path) -> None:
    init_env("typed_env", tmp_path)
    mypy = Path(sys.executable).with_name("mypy")
    command = [mypy, "--strict", "--cache-dir", tmp_path / ".mypy_cache", "typed_env"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_scaffolds_own_tests_pass_without_warnings_for_a_name_starting_with_test(
    tmp_path: Path,
) -> None:
    # Its classes are TestAction, TestEnv...: imported into the test module, pytest
    # tried to collect them and printed a warning for each.
    folder = init_env("test_env", tmp_path)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout, done.stdout
    assert "warning" not in done.stdout.lower(), done.stdout


def test_echo_env_has_exactly_the_template_layout(tmp_path: Path) -> None:
    rendered = tmp_path / "echo_env"
    render_template("echo_env", rendered)  # `init` refuses the name: echo_env is installed
    assert files(ECHO) == files(rendered)
    for same in (".dockerignore", "server/Dockerfile"):
        assert (ECHO / same).read_text() == (rendered / same).read_text(), same
    ours = tomllib.loads((ECHO / "pyproject.toml").read_text())
    theirs = tomllib.loads((rendered / "pyproject.toml").read_text())
    ours["project"].pop("description")
    theirs["project"].pop("description")
    assert ours == theirs


def test_the_checkout_serves_the_template_to_an_editable_install() -> None:
    assert template_dir() == REPO / "templates" / "env"


def test_every_command_has_help() -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert {"init", "serve", "validate"} <= set(commands)
    for name in commands:
        result = CliRunner().invoke(app, [name, "--help"])
        assert result.exit_code == 0, name
        assert f"Usage: openenv {name}" in result.stdout, name


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("openenv ")


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_generated_and_shipped_environments_depend_on_our_distribution(tmp_path: Path) -> None:
    # PyPI's `openenv` is Hugging Face's OpenEnv: depending on that name would
    # install the peer, whose `openenv` module has none of ours.
    ours = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert ours != "openenv"
    folder = init_env("named_env", tmp_path)
    for pyproject_path in [folder / "pyproject.toml", *REPO.glob("envs/*/pyproject.toml")]:
        dependencies = tomllib.loads(pyproject_path.read_text())["project"]["dependencies"]
        names = {_requirement_name(requirement) for requirement in dependencies}
        assert ours in names, pyproject_path
        assert "openenv" not in names, pyproject_path
    readme = (folder / "README.md").read_text()
    assert f"installs {ours} too" in readme


def test_forced_writes_stay_inside_the_folder_whatever_links_it_holds(tmp_path: Path) -> None:
    folder = init_env("my_env", tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    precious = outside / "precious.py"
    precious.write_text("# not the template's\n")
    (folder / "models.py").unlink()
    (folder / "models.py").symlink_to(precious)  # a file that links out: replaced, not followed
    forced = CliRunner().invoke(app, ["init", "my_env", "-o", str(tmp_path), "--force"])
    assert forced.exit_code == 0, forced.output
    assert precious.read_text() == "# not the template's\n"
    assert not (folder / "models.py").is_symlink()
    assert "class MyAction(Action)" in (folder / "models.py").read_text()

    shutil.rmtree(folder / "server")
    (folder / "server").symlink_to(outside, target_is_directory=True)  # a folder that links out
    (folder / "models.py").write_text("# mine\n")
    refused = CliRunner().invoke(app, ["init", "my_env", "-o", str(tmp_path), "--force"])
    assert refused.exit_code == 1
    assert (
        refused.stderr.strip()
        == f"error: {folder}: server links out of the folder; remove the link"
    )
    assert sorted(p.name for p in outside.iterdir()) == ["precious.py"]  # nothing written there
    assert (folder / "models.py").read_text() == "# mine\n"  # nor anywhere: refused first
