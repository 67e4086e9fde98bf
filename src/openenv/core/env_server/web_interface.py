"""``openenv.core.env_server.web_interface``: what OpenEnv 0.10's environments import.

openenv serves its own page at ``/web``; of OpenEnv's Gradio interface, only
``load_environment_metadata`` is here, which an environment's own page reads
(wildfire_env's ``app.py``).

>>> from openenv.core.env_server.interfaces import Environment
>>> class Fire(Environment):
...     pass
>>> load_environment_metadata(Fire, "fire_env").name
'fire_env'
>>> load_environment_metadata(Fire()).description
'Fire environment'
"""

from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.types import EnvironmentMetadata

__all__ = ["load_environment_metadata"]


def load_environment_metadata(env: Any, env_name: str | None = None) -> EnvironmentMetadata:
    """An environment's metadata, as OpenEnv's: an OpenEnv ``Environment`` instance's
    ``get_metadata()``; for a factory (a class, a function, a ``functools.partial``),
    a default named ``env_name`` with the README found on disk (``$ENV_README_PATH``,
    ``envs/{env_name}/README.md``, ``/app/env/README.md``, ``/app/README.md``)."""
    if isinstance(env, Environment):
        return env.get_metadata()
    if isinstance(env, functools.partial):
        env = env.func
    if not inspect.isclass(env) and not callable(env):
        env = type(env)  # an instance of another Environment class
    class_name = env.__name__ if inspect.isclass(env) else env_name or env.__name__
    return EnvironmentMetadata(
        name=env_name or class_name,
        description=f"{class_name} environment",
        version="1.0.0",
        readme_content=_readme(env_name),
    )


def _readme(env_name: str | None) -> str | None:
    candidates = [Path(os.environ["ENV_README_PATH"])] if os.environ.get("ENV_README_PATH") else []
    if env_name:
        candidates.append(Path(f"envs/{env_name}/README.md"))
    candidates += [Path("/app/env/README.md"), Path("/app/README.md")]
    for path in candidates:
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return None
