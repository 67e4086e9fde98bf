"""What ``create_app`` learns about an environment factory before serving it."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from openenv.environment import Environment
from openenv.errors import ConcurrencyConfigurationError
from openenv.server.config import ConcurrencyConfig
from openenv.types import State

__all__ = ["EnvFactory", "check_concurrency", "check_factory", "environment_class", "state_class"]

EnvFactory = Callable[[], Environment[Any, Any, Any]]


def check_factory(factory: object) -> None:
    """Refuse anything that cannot make a new environment per session."""
    if isinstance(factory, Environment):
        name = type(factory).__name__
        raise TypeError(
            f"create_app() needs a factory that makes a new environment for every session, "
            f"but got an instance of {name}. Pass the class ({name}) or a zero-argument "
            f"callable (e.g. functools.partial({name}, ...)) instead of {name}(...)."
        )
    if not callable(factory):
        raise TypeError(
            f"create_app() needs an environment class or a zero-argument callable, "
            f"got {type(factory).__name__}"
        )


def environment_class(factory: object) -> type[Environment[Any, Any, Any]] | None:
    """The class a factory makes, when it can be known without calling it."""
    while isinstance(factory, functools.partial):
        factory = factory.func
    if isinstance(factory, type):
        return factory if issubclass(factory, Environment) else None
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # unresolvable annotations: treat as unknown
        return None
    returned = hints.get("return")
    returned = typing.get_origin(returned) or returned
    if isinstance(returned, type) and issubclass(returned, Environment):
        return returned
    return None


def check_concurrency(factory: object, config: ConcurrencyConfig) -> None:
    """Refuse, at startup, to share an environment not declared safe for it."""
    if config.max_concurrent_envs <= 1:
        return
    env_cls = environment_class(factory)
    flag = getattr(factory, "SUPPORTS_CONCURRENT_SESSIONS", None)
    if env_cls is None and flag is None:
        raise ConcurrencyConfigurationError(
            f"cannot tell which environment {factory!r} creates, so cannot check that "
            f"max_concurrent_envs={config.max_concurrent_envs} is safe. Annotate its return "
            f"type (def make_env() -> MyEnvironment: ...) or use max_concurrent_envs=1."
        )
    supported = flag if flag is not None else env_cls.SUPPORTS_CONCURRENT_SESSIONS  # type: ignore[union-attr]
    if not supported:
        name = env_cls.__name__ if env_cls is not None else repr(factory)
        raise ConcurrencyConfigurationError(
            f"{name} does not declare SUPPORTS_CONCURRENT_SESSIONS = True, so it may not be "
            f"safe to run {config.max_concurrent_envs} instances in one process. If its "
            f"instances share no mutable state, set SUPPORTS_CONCURRENT_SESSIONS = True on "
            f"the class; otherwise use ConcurrencyConfig(max_concurrent_envs=1) and scale "
            f"with more server processes."
        )


def state_class(env_cls: type[Environment[Any, Any, Any]] | None) -> type[State]:
    """The ``State`` model an environment class declares in its generic arguments."""
    if env_cls is None:
        return State
    for klass in inspect.getmro(env_cls):
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is Environment:
                args = typing.get_args(base)
                if len(args) == 3 and isinstance(args[2], type) and issubclass(args[2], State):
                    return args[2]
    return State
