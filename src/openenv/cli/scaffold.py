"""``openenv init``: copy the environment template, with the new name filled in."""

from __future__ import annotations

import importlib.util
import keyword
import os
import re
import shlex
import sys
import unicodedata
from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "check_name",
    "check_not_installed",
    "class_prefix",
    "init_command",
    "init_env",
    "next_steps",
    "render_template",
    "template_dir",
]

# The template is a working environment whose names are these placeholders.
NAME_PLACEHOLDER = "__env_name__"
PREFIX_PLACEHOLDER = "__Prefix__"

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
# `server` is the package every environment folder serves from; `openenv` is us.
_RESERVED = {"openenv", "server"}
# Modules of the folder itself: served from the folder (`uvicorn server.app:app`,
# `openenv serve`), `import NAME` would find NAME.py there, not the package, and
# `from NAME.models import ...` in server/app.py could never import.
_FOLDER_MODULES = {"models": "models.py", "client": "client.py", "tests": "tests/ folder"}
_SKIPPED = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
# File systems take names of 255 bytes: the template's tests/test_NAME.py and
# pip's files for an editable install (__editable___NAME_0_1_0_finder.py) must fit.
_MAX_NAME = 100


def template_dir() -> Path:
    """The folder ``init_env`` copies: inside the wheel, or in a source checkout.

    >>> sorted(p.name for p in template_dir().iterdir() if p.suffix == ".py")
    ['__init__.py', 'client.py', 'models.py']
    """
    here = Path(__file__).resolve()
    # A wheel carries the template as openenv/templates (hatch force-include);
    # an editable install of a checkout finds it at the repository's top level.
    for root in (here.parents[1] / "templates", here.parents[3] / "templates"):
        if (root / "env" / "pyproject.toml").is_file():
            return root / "env"
    raise FileNotFoundError(f"the environment template is missing from {here.parents[1]}")


def check_name(name: str) -> None:
    """Refuse a NAME that cannot be a Python package and an installable project.

    >>> check_name("my_env")
    >>> check_name("My-Env")
    Traceback (most recent call last):
    ...
    ValueError: 'My-Env' is not a valid environment name: use a lowercase Python identifier \
(letters, digits and underscores, starting with a letter). Did you mean 'my_env'?
    >>> check_name("json")
    Traceback (most recent call last):
    ...
    ValueError: 'json' would shadow Python's own json module; pick another name, e.g. 'json_env'
    """
    if len(name) > _MAX_NAME:
        raise ValueError(
            f"{name[:20]!r}... is {len(name)} characters long; pick a name of at most "
            f"{_MAX_NAME}, so that the files named after it can be written"
        )
    if keyword.iskeyword(name):
        raise ValueError(f"{name!r} is a Python keyword; pick another name, e.g. '{name}_env'")
    if name in _RESERVED or name in sys.stdlib_module_names:
        owner = "openenv's" if name in _RESERVED else "Python's own"
        raise ValueError(
            f"{name!r} would shadow {owner} {name} module; pick another name, e.g. '{name}_env'"
        )
    if name in _FOLDER_MODULES:
        raise ValueError(
            f"{name!r} would shadow the environment's own {_FOLDER_MODULES[name]} "
            f"(server/app.py imports {name}.models); pick another name, e.g. '{name}_env'"
        )
    if not _NAME.match(name):
        message = (
            f"{name!r} is not a valid environment name: use a lowercase Python identifier "
            f"(letters, digits and underscores, starting with a letter)."
        )
        # Accents dropped rather than letters: 'café' suggests 'cafe', not 'caf'.
        ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
        suggestion = re.sub(r"[^a-z0-9]+", "_", ascii_name.lower()).strip("_")
        if suggestion[:1].isdigit():
            suggestion = f"env_{suggestion}"
        if _NAME.match(suggestion) and not keyword.iskeyword(suggestion):
            message += f" Did you mean {suggestion!r}?"
        raise ValueError(message)


def class_prefix(name: str) -> str:
    """The CamelCase prefix of an environment's class names.

    >>> class_prefix("my_env"), class_prefix("grid_world"), class_prefix("env")
    ('My', 'GridWorld', 'Env')
    """
    base = name.removesuffix("_env") or name
    return "".join(part[:1].upper() + part[1:] for part in base.split("_"))


def init_env(name: str, output_dir: str | Path = ".", *, force: bool = False) -> Path:
    """Create the environment ``NAME`` in ``output_dir/NAME`` from the template.

    Args:
        name: The package name, a lowercase identifier such as ``my_env``.
        output_dir: The folder to create it in (created if missing).
        force: Write into an existing folder, replacing the template's files
            (a link among them is replaced, not followed) and leaving any
            others alone.

    Returns:
        The new environment's folder.

    Raises:
        ValueError: ``name`` is not a usable package name, or a module of
            that name is installed already.
        FileExistsError: the folder exists and ``force`` is false, or one of
            its folders the template writes into links out of it, or is a file
            (or one of the template's files is a folder there); nothing is
            written then.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     folder = init_env("grid_world", tmp)
    ...     print((folder / "server" / "app.py").read_text().count("GridWorldEnvironment"))
    2
    """
    check_name(name)
    target = Path(output_dir) / name
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a folder")
    if target.exists() and not force:
        raise FileExistsError(f"{target} already exists; pass --force to overwrite its files")
    check_not_installed(name, target)
    render_template(name, target)
    return target


def check_not_installed(name: str, target: Path) -> None:
    """Refuse a name that already imports from elsewhere: installing ours would replace it.

    >>> check_not_installed("typer", Path("typer"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: 'typer' is already installed here (typer); ... e.g. 'typer_env'
    """
    spec = importlib.util.find_spec(name)
    if spec is None:
        return
    locations = [*(spec.submodule_search_locations or []), *([spec.origin] if spec.origin else [])]
    if any(Path(place).resolve().is_relative_to(target.resolve()) for place in locations):
        return  # our own earlier copy, installed in editable mode: --force may refresh it
    raise ValueError(
        f"{name!r} is already installed here ({spec.name}); an environment of that name "
        f"would replace it, so pick another name, e.g. '{name}_env'"
    )


def render_template(name: str, target: Path) -> None:
    """Write the template into ``target`` with ``name`` and its class prefix filled in."""
    replacements = {NAME_PLACEHOLDER: name, PREFIX_PLACEHOLDER: class_prefix(name)}
    source = template_dir()
    files = {}
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if not path.is_file() or _SKIPPED.intersection(relative.parts) or path.suffix == ".pyc":
            continue
        files[target / _render(str(relative), replacements)] = path
    # With --force, into a folder that may hold links: nothing is written
    # outside it. A folder that links out is refused before any file is written,
    # and a file that is a link is replaced, not the file it points to.
    root = target.resolve()
    for destination in files:
        if not destination.parent.resolve().is_relative_to(root):
            where = destination.parent.relative_to(target)
            raise FileExistsError(f"{target}: {where} links out of the folder; remove the link")
        # So is a file where the template has a folder, or a folder where it has
        # a file: found half-way, it left the template half-written.
        for folder in (destination.parent, *destination.parent.parents):
            if folder == target:
                break
            if os.path.lexists(folder) and not folder.is_dir():
                where = folder.relative_to(target)
                raise FileExistsError(
                    f"{target}: {where} is a file where the template has a folder"
                )
        if destination.is_dir() and not destination.is_symlink():
            where = destination.relative_to(target)
            raise FileExistsError(f"{target}: {where} is a folder where the template has a file")
    for destination, path in files.items():
        destination.parent.mkdir(parents=True, exist_ok=True)
        if destination.is_symlink():
            destination.unlink()
        destination.write_text(_render(path.read_text(encoding="utf-8"), replacements))


def next_steps(folder: Path) -> list[str]:
    """The commands that take a new environment to a tested, validated server (as the README).

    >>> next_steps(Path("envs/my_env"))  # doctest: +NORMALIZE_WHITESPACE
    ["pip install -e 'envs/my_env[test]'", 'openenv validate envs/my_env',
     'pytest envs/my_env', 'openenv serve envs/my_env',
     'openenv validate --url http://127.0.0.1:8000']
    >>> next_steps(Path("My Projects/my_env"))[:2]
    ["pip install -e 'My Projects/my_env[test]'", "openenv validate 'My Projects/my_env'"]
    """
    # Quoted for the shell, so that they paste as they are: a folder may hold spaces.
    where = shlex.quote(str(folder))
    return [
        f"pip install -e {shlex.quote(f'{folder}[test]')}",
        f"openenv validate {where}",
        f"pytest {where}",
        f"openenv serve {where}",
        "openenv validate --url http://127.0.0.1:8000",
    ]


def _render(text: str, replacements: dict[str, str]) -> str:
    for placeholder, value in replacements.items():
        text = text.replace(placeholder, value)
    return text


def init_command(
    name: Annotated[str, typer.Argument(help="Package name of the environment, e.g. my_env.")],
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Folder to create NAME/ in.")
    ] = Path("."),
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite the template's files in an existing folder.")
    ] = False,
) -> None:
    """Create a new environment folder from the template: models, server, client, tests, Docker."""
    try:
        folder = init_env(name, output_dir, force=force)
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"Created {folder}/ ({class_prefix(name)}Environment in server/environment.py).")
    typer.echo("Next, run:")
    for command in next_steps(folder):
        typer.echo(f"  {command}")
