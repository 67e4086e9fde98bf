"""Environment folders for CLI tests, written into a temporary folder.

Their ``server/app.py`` defines everything itself and imports only openenv, so
the folder can be validated and served without installing a package.
"""

from __future__ import annotations

from pathlib import Path

PYPROJECT = """\
[project]
name = "inline_env"
version = "0.1.0"
dependencies = ["openenv-scale>=0.1"]

[project.scripts]
server = "inline_env.server.app:main"

[tool.setuptools]
packages = ["inline_env", "inline_env.server"]
package-dir = { "inline_env" = ".", "inline_env.server" = "server" }
"""

# Reports the process it runs in, so a test can tell `serve --workers` processes apart.
APP = """\
import os
from typing import Any

from openenv import Action, ConcurrencyConfig, Environment, Observation, State, create_app


class Ping(Action):
    note: str = ""


class Where(Observation):
    pid: int


class PidEnvironment(Environment[Ping, Where, State]):
    SUPPORTS_CONCURRENT_SESSIONS = {concurrent}

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Where:
        self._state = State(episode_id=episode_id)
        return Where(pid=os.getpid())

    def step(self, action: Ping, **kwargs: Any) -> Where:
        self._state.step_count += 1
        return Where(pid=os.getpid(), reward=1.0)

    @property
    def state(self) -> State:
        return self._state


{factory}

app = create_app(make, Ping, Where, {config})


def main() -> None:
    pass
"""


def write_env(
    folder: Path,
    *,
    concurrent: bool = True,
    factory: str = "make = PidEnvironment",
    config: str = "ConcurrencyConfig.from_env(max_concurrent_envs=8)",
    app: str | None = None,
) -> Path:
    """Write a complete environment folder; ``app`` replaces server/app.py altogether."""
    (folder / "server").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "pyproject.toml").write_text(PYPROJECT)
    for name in ("__init__.py", "models.py", "client.py", "README.md", "server/__init__.py"):
        (folder / name).write_text("")
    (folder / "server" / "environment.py").write_text("")
    (folder / "server" / "Dockerfile").write_text("")
    text = app or APP.format(concurrent=concurrent, factory=factory, config=config)
    (folder / "server" / "app.py").write_text(text)
    return folder
