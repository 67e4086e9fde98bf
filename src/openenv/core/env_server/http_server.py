"""``openenv.core.env_server.http_server``: OpenEnv 0.10's ``create_app``, served by openenv.

An ``app.py`` written for OpenEnv (``create_app(Env, Action, Observation,
env_name="echo", max_concurrent_envs=8)``) runs here unchanged. OpenEnv's
Gradio options are accepted and have no effect: openenv serves its own page
at ``/web``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from openenv.core._mcp_types import mcp_action_class
from openenv.core._models import State as _OpenEnvState
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.session_thread import OnItsOwnThread
from openenv.server.app import create_app as _create_app
from openenv.server.config import ConcurrencyConfig
from openenv.server.factory import environment_class
from openenv.types import Action, Observation, State

__all__ = ["create_app", "create_fastapi_app"]


def create_app(
    env: Callable[[], Any],
    action_cls: type[Action],
    observation_cls: type[Observation],
    env_name: str | None = None,
    max_concurrent_envs: int | None = None,
    concurrency_config: ConcurrencyConfig | None = None,
    gradio_builder: Callable[..., Any] | None = None,
    custom_tab_name: str = "Custom",
    custom_tab_primary: bool = False,
    show_default_tab: bool = True,
    title_override: str | None = None,
    state_cls: type[State] | None = None,
    *,
    mode: str | None = None,
    reset_observation_cls: type[Observation] | None = None,
    **settings: Any,
) -> FastAPI:
    """OpenEnv 0.10's ``create_app`` signature, onto ``openenv.create_app``.

    The session cap is ``max_concurrent_envs`` or ``concurrency_config`` (not
    both, as in OpenEnv), else ``$MAX_CONCURRENT_ENVS``, else one session;
    ``$OPENENV_MAX_CONCURRENT_ENVS`` (what ``openenv serve --max-sessions``
    sets) wins over all of them. Further keywords are ``openenv.create_app``
    settings (``step_timeout=30``, ``mcp=True``, ...). As on OpenEnv, an app
    whose action class is ``Action``, ``CallToolAction`` or ``ListToolsAction``
    takes both MCP actions by their ``type``.

    >>> from openenv.core.env_server.http_server import create_app
    >>> from echo_env.models import EchoAction, EchoObservation
    >>> from echo_env.server.environment import EchoEnvironment
    >>> app = create_app(EchoEnvironment, EchoAction, EchoObservation,
    ...                  env_name="echo_env", max_concurrent_envs=8)
    >>> app.state.openenv.concurrency.max_concurrent_envs, app.state.openenv.metadata.name
    (8, 'echo_env')
    """
    if max_concurrent_envs is not None and concurrency_config is not None:
        raise ValueError("pass max_concurrent_envs or concurrency_config, not both")
    if concurrency_config is None:
        cap = max_concurrent_envs or _cap_from_env()
        concurrency_config = ConcurrencyConfig.from_env(max_concurrent_envs=cap)
    elif os.environ.get("OPENENV_MAX_CONCURRENT_ENVS"):
        concurrency_config = ConcurrencyConfig.from_env(
            max_concurrent_envs=concurrency_config.max_concurrent_envs,
            session_timeout=concurrency_config.session_timeout,
        )
    made = environment_class(env)
    if made is None or issubclass(made, Environment):
        env = OnItsOwnThread(env)
    return _create_app(
        env,
        mcp_action_class(action_cls),
        observation_cls,
        concurrency_config,
        state_cls=None if state_cls in (State, _OpenEnvState) else state_cls,
        env_name=title_override or env_name,
        **settings,
    )


def create_fastapi_app(
    env: Callable[[], Any],
    action_cls: type[Action],
    observation_cls: type[Observation],
    max_concurrent_envs: int | None = None,
    concurrency_config: ConcurrencyConfig | None = None,
    env_name: str | None = None,
    state_cls: type[State] | None = None,
    *,
    mode: str | None = None,
    reset_observation_cls: type[Observation] | None = None,
    **settings: Any,
) -> FastAPI:
    """OpenEnv 0.10's ``create_fastapi_app`` (its app without the web page)."""
    return create_app(
        env,
        action_cls,
        observation_cls,
        env_name=env_name,
        max_concurrent_envs=max_concurrent_envs,
        concurrency_config=concurrency_config,
        state_cls=state_cls,
        web=False,
        **settings,
    )


def _cap_from_env() -> int:
    """``$MAX_CONCURRENT_ENVS`` (OpenEnv's variable), else one session."""
    raw = os.environ.get("MAX_CONCURRENT_ENVS") or "1"
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        # int()'s own message (or pydantic's, of a field) named neither the
        # variable nor what it wants.
        raise ValueError(
            f"MAX_CONCURRENT_ENVS must be a whole number of sessions, 1 or more, not {raw!r}"
        )
    return cap
