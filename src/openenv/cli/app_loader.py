"""Import an environment folder's ``server/app.py`` the way ``uvicorn server.app:app`` does."""

from __future__ import annotations

import contextlib
import importlib
import os
import shlex
import sys
import tomllib
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from openenv.errors import OpenEnvError
from openenv.protocol_errors import summarise

__all__ = ["AppLoadError", "imported_app", "package_name"]

APP_MODULE = "server.app"


class AppLoadError(OpenEnvError):
    """``server/app.py`` is missing or raised while being imported."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def package_name(folder: Path) -> str | None:
    """The import name of the package a folder holds, from its ``pyproject.toml``."""
    try:
        project = tomllib.loads((folder / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    name = project.get("name") if isinstance(project, dict) else None
    return name.replace("-", "_") if isinstance(name, str) else None


@contextlib.contextmanager
def imported_app(
    folder: str | Path, environ: Mapping[str, str | None] | None = None
) -> Iterator[Any]:
    """Import ``server/app.py`` from ``folder`` and yield its ``app``.

    Within the block, ``folder`` is on ``sys.path`` and ``environ`` is applied to
    ``os.environ`` (``None`` removes a variable). Afterwards both are restored and
    the ``server`` modules are forgotten, so another folder can be imported next.

    Raises:
        AppLoadError: there is no ``server/app.py`` or no ``app`` in it, or it
            raised; the message names the cause in one line.
    """
    folder = Path(folder).resolve()
    if not (folder / "server" / "app.py").is_file():
        raise AppLoadError(
            f"{folder} has no server/app.py; is it an environment folder? "
            f"(create one with: openenv init NAME)"
        )
    environ = environ or {}
    saved_modules = _forget_server_modules()
    saved_environ = {key: os.environ.get(key) for key in environ}
    _apply(environ)
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        module = _import(folder)
        if not hasattr(module, "app"):
            raise AppLoadError(f"{folder / 'server' / 'app.py'} defines no `app`")
        yield module.app
    finally:
        sys.path.remove(str(folder))
        _apply(saved_environ)
        _forget_server_modules()
        sys.modules.update(saved_modules)


def _import(folder: Path) -> ModuleType:
    try:
        return importlib.import_module(APP_MODULE)
    except ModuleNotFoundError as exc:
        package = package_name(folder)
        if package and exc.name and (exc.name == package or exc.name.startswith(package + ".")):
            raise AppLoadError(
                f"server/app.py imports {package}, which is not installed in this Python "
                f"({sys.executable}); run: pip install -e {shlex.quote(str(folder))}",
                exc,
            ) from None
        raise AppLoadError(_describe(folder, exc), exc) from None
    except (Exception, SystemExit) as exc:  # a sys.exit() in user code must not end our process
        raise AppLoadError(_describe(folder, exc), exc) from None


def _describe(folder: Path, exc: BaseException) -> str:
    """``server/app.py:12: NameError: ...``: where in the folder it failed, and why."""
    where = "server/app.py"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename)
        if path.is_relative_to(folder):
            where = f"{path.relative_to(folder)}:{frame.lineno}"
            break
    if isinstance(exc, ValidationError):  # its first line only counts the errors
        reason = f"{exc.title}: {summarise(exc)}"
    else:
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return f"importing {where} failed: {reason}"


def _forget_server_modules() -> dict[str, ModuleType]:
    names = [name for name in sys.modules if name == "server" or name.startswith("server.")]
    return {name: sys.modules.pop(name) for name in names}


def _apply(environ: Mapping[str, str | None]) -> None:
    for key, value in environ.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
