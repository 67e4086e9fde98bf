"""``openenv validate PATH``: check an environment folder before serving it."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import sys
import tomllib
import traceback
from pathlib import Path
from typing import Any

from openenv.cli.app_loader import APP_MODULE, AppLoadError, imported_app
from openenv.cli.checklist import Checklist
from openenv.cli.serve import MAX_SESSIONS_VAR, SESSION_TIMEOUT_VAR
from openenv.errors import ConcurrencyConfigurationError

__all__ = ["RECOMMENDED_FILES", "REQUIRED_FILES", "validate_folder"]

REQUIRED_FILES = ("pyproject.toml", "__init__.py", "server/__init__.py", "server/app.py")
RECOMMENDED_FILES = (
    "models.py",
    "client.py",
    "server/environment.py",
    "server/Dockerfile",
    "README.md",
    "tests",
)
# The distribution is openenv-scale; PyPI's `openenv` is Hugging Face's OpenEnv.
_OPENENV_REQUIREMENT = re.compile(
    r"openenv[-_.]scale\s*(?:\[.*\])?\s*(?:[<>=!~;@]|$)", re.IGNORECASE
)
_PEER_REQUIREMENT = re.compile(r"openenv\s*(?:\[.*\])?\s*(?:[<>=!~;@]|$)", re.IGNORECASE)
# Values no app would pick by itself: if they show up, the app read them.
_PROBE_TIMEOUT = 1234.5


def validate_folder(path: str | Path = ".") -> Checklist:
    """Check that ``path`` is an environment folder ``openenv serve`` can serve.

    Checks: the layout ``openenv init`` creates; the ``pyproject.toml`` entry
    point and package mapping; that ``server/app.py`` imports and has ``app``
    and ``main``; that the app got a factory (a new environment per session)
    rather than an instance; that the session cap agrees with
    ``SUPPORTS_CONCURRENT_SESSIONS``; and that ``openenv serve --max-sessions``
    and ``--session-timeout`` reach the app.

    >>> report = validate_folder("envs/echo_env")
    >>> report.ok, [check.name for check in report.checks if check.status != "pass"]
    (True, [])
    """
    folder = Path(path).resolve()
    report = Checklist(str(folder))
    if not folder.is_dir():
        report.add("layout", "fail", f"{folder} is not a folder")
        return report
    _check_layout(folder, report)
    _check_pyproject(folder, report)
    _check_app(folder, report)
    return report


def _check_layout(folder: Path, report: Checklist) -> None:
    missing = [name for name in REQUIRED_FILES if not (folder / name).exists()]
    optional = [name for name in RECOMMENDED_FILES if not (folder / name).exists()]
    if missing:
        report.add(
            "layout",
            "fail",
            f"missing {', '.join(missing)}; not an environment folder? "
            f"(create one with: openenv init NAME)",
        )
    elif optional:
        report.add("layout", "warn", f"missing {', '.join(optional)} (openenv init creates them)")
    else:
        report.add("layout", "pass", "pyproject.toml, models, client, server/, tests/, Dockerfile")


def _check_pyproject(folder: Path, report: Checklist) -> None:
    try:
        data = tomllib.loads((folder / "pyproject.toml").read_text())
    except OSError:
        report.add("pyproject", "skip", "no pyproject.toml")
        return
    except tomllib.TOMLDecodeError as exc:
        report.add("pyproject", "fail", f"pyproject.toml is not valid TOML: {exc}")
        return
    name = _lookup(data, "project", "name")
    if not isinstance(name, str):
        report.add("pyproject", "fail", "pyproject.toml has no [project] name")
        return
    package = name.replace("-", "_")
    problems = []
    entry_point = f"{package}.server.app:main"
    found = _lookup(data, "project", "scripts", "server")
    if found != entry_point:
        problems.append(f'[project.scripts] needs server = "{entry_point}" (found {found!r})')
    package_dir = _lookup(data, "tool", "setuptools", "package-dir")
    wanted = {package: ".", f"{package}.server": "server"}
    if package_dir is not None and (
        not isinstance(package_dir, dict) or any(package_dir.get(k) != v for k, v in wanted.items())
    ):
        problems.append(
            f'[tool.setuptools] package-dir needs {{ "{package}" = ".", '
            f'"{package}.server" = "server" }}'
        )
    dependencies = _lookup(data, "project", "dependencies") or []
    if not isinstance(dependencies, list) or not all(isinstance(d, str) for d in dependencies):
        problems.append(
            f"[project] dependencies must be a list of strings (found {dependencies!r})"
        )
    elif any(_PEER_REQUIREMENT.match(dep) for dep in dependencies):
        problems.append(
            "[project] dependencies name `openenv`, which on PyPI is Hugging Face's OpenEnv: "
            "depend on openenv-scale"
        )
    elif not any(_OPENENV_REQUIREMENT.match(dep) for dep in dependencies):
        problems.append("[project] dependencies lack openenv-scale")
    if problems:
        report.add("pyproject", "fail", "; ".join(problems))
    else:
        report.add("pyproject", "pass", f"package {package}, script server = {entry_point}")


def _lookup(data: Any, *keys: str) -> Any:
    """``data[k1][k2]...``, or None where a key is missing or a value is not a table.

    A hand-written pyproject.toml may hold anything where a table belongs
    (``scripts = "x"``): that is a failed check, not a traceback.
    """
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _check_app(folder: Path, report: Checklist) -> None:
    # Import without the caller's OPENENV_* settings: check the app's own defaults.
    clean: dict[str, str | None] = {MAX_SESSIONS_VAR: None, SESSION_TIMEOUT_VAR: None}
    try:
        with imported_app(folder, clean) as app:
            main = getattr(sys.modules[APP_MODULE], "main", None)
            service = getattr(getattr(app, "state", None), "openenv", None)
            if service is None:
                report.add("app", "fail", "`app` in server/app.py was not made by create_app()")
                for name in ("factory", "concurrency", "serve options"):
                    report.add(name, "skip", "not an openenv app")
                return
            if not callable(main):
                report.add("app", "fail", "server/app.py has no main() for the `server` script")
            else:
                report.add("app", "pass", f"server/app.py serves {service.metadata.name}")
            _check_factory(service.env_factory, report)
            flag = _check_concurrency(service, report)
    except AppLoadError as exc:
        _report_load_error(exc, report)
        return
    _check_serve_options(folder, service.registry.max_sessions, flag, report)


def _report_load_error(exc: AppLoadError, report: Checklist) -> None:
    cause = exc.cause
    if isinstance(cause, TypeError) and _raised_by_check_factory(cause):
        report.add("app", "fail", "create_app() refused the environment factory")
        report.add("factory", "fail", str(cause))
        report.add("concurrency", "skip", "the app did not import")
    elif isinstance(cause, ConcurrencyConfigurationError):
        report.add("app", "fail", "create_app() refused the session cap")
        report.add("factory", "skip", "the app did not import")
        report.add("concurrency", "fail", str(cause))
    else:
        report.add("app", "fail", str(exc))
        report.add("factory", "skip", "the app did not import")
        report.add("concurrency", "skip", "the app did not import")
    report.add("serve options", "skip", "the app did not import")


def _raised_by_check_factory(exc: BaseException) -> bool:
    return any(frame.name == "check_factory" for frame in traceback.extract_tb(exc.__traceback__))


def _check_factory(factory: Any, report: Checklist) -> None:
    from openenv.environment import Environment

    if isinstance(factory, type):
        report.add("factory", "pass", f"the class {factory.__name__}: a new instance per session")
        return
    try:
        first, second = _call(factory), _call(factory)
    except Exception as exc:
        report.add("factory", "fail", f"calling the factory raised {type(exc).__name__}: {exc}")
        return
    try:
        if not isinstance(first, Environment):
            report.add("factory", "fail", f"the factory returned a {type(first).__name__}")
        elif first is second:
            report.add(
                "factory",
                "fail",
                f"the factory returned the same {type(first).__name__} twice; every session "
                f"needs its own instance (pass the class, or a function that creates one)",
            )
        else:
            report.add("factory", "pass", f"makes a new {type(first).__name__} per session")
    finally:
        for env in {id(first): first, id(second): second}.values():
            if isinstance(env, Environment):
                with contextlib.suppress(Exception):  # a failing close() is not the factory's fault
                    _call(env.close)


def _check_concurrency(service: Any, report: Checklist) -> bool:
    from openenv.server.factory import environment_class

    env_cls = environment_class(service.env_factory)
    flag = bool(
        env_cls.SUPPORTS_CONCURRENT_SESSIONS
        if env_cls is not None
        else getattr(service.env_factory, "SUPPORTS_CONCURRENT_SESSIONS", False)
    )
    cap = service.registry.max_sessions
    advertised = service.metadata.supports_concurrent_sessions
    if advertised != flag:
        report.add(
            "concurrency",
            "fail",
            f"/metadata says supports_concurrent_sessions={advertised}, but the environment "
            f"declares SUPPORTS_CONCURRENT_SESSIONS = {flag}",
        )
    elif cap > 1 and not flag:  # create_app refuses this; only a hand-built app gets here
        report.add("concurrency", "fail", f"{cap} sessions per process, but not declared safe")
    elif flag:
        report.add(
            "concurrency", "pass", f"SUPPORTS_CONCURRENT_SESSIONS = True, {cap} sessions/process"
        )
    else:
        report.add(
            "concurrency",
            "pass",
            "one session per process (SUPPORTS_CONCURRENT_SESSIONS = False); "
            "scale with openenv serve --workers N",
        )
    return flag


def _check_serve_options(folder: Path, cap: int, concurrent: bool, report: Checklist) -> None:
    """Import again under OPENENV_* values and see whether the app picked them up."""
    probe: dict[str, str | None] = {SESSION_TIMEOUT_VAR: str(_PROBE_TIMEOUT)}
    if concurrent:
        probe[MAX_SESSIONS_VAR] = str(cap + 1)
    try:
        with imported_app(folder, probe) as app:
            service = app.state.openenv
            got_cap, got_timeout = (
                service.registry.max_sessions,
                service.concurrency.session_timeout,
            )
    except AppLoadError as exc:
        report.add("serve options", "fail", f"with {probe}: {exc}")
        return
    ignored = []
    if concurrent and got_cap != cap + 1:
        ignored.append(f"{MAX_SESSIONS_VAR} (--max-sessions, --workers)")
    if got_timeout != _PROBE_TIMEOUT:
        ignored.append(f"{SESSION_TIMEOUT_VAR} (--session-timeout)")
    if ignored:
        report.add(
            "serve options",
            "warn",
            f"server/app.py ignores {' and '.join(ignored)}; build its config with "
            f"ConcurrencyConfig.from_env(...) so openenv serve can set them",
        )
    else:
        report.add("serve options", "pass", "openenv serve can set the session cap and timeout")


def _call(fn: Any) -> Any:
    result = fn()
    if inspect.isawaitable(result):
        return asyncio.run(_wait(result))
    return result


async def _wait(awaitable: Any) -> Any:
    return await awaitable
