"""openenv: serve any environment over WebSocket sessions; drive thousands at once.

Write an environment, serve it, drive it:

>>> from openenv import Action, Environment, Observation, State, create_app
>>> class Say(Action):
...     text: str
>>> class Heard(Observation):
...     text: str
>>> class Parrot(Environment[Say, Heard, State]):
...     SUPPORTS_CONCURRENT_SESSIONS = True
...     def reset(self, seed=None, episode_id=None, **kwargs):
...         return Heard(text="")
...     def step(self, action, **kwargs):
...         return Heard(text=action.text, reward=1.0, done=True)
>>> app = create_app(Parrot, Say, Heard)  # serve with: uvicorn module:app

The server half (``create_app`` and friends) is imported on first use, so
training code that only drives environments never imports FastAPI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from openenv.client import AnyObservation, EnvClient, SyncEnvClient, WebSocketEnvClient
from openenv.environment import Environment
from openenv.errors import (
    CapacityError,
    ConcurrencyConfigurationError,
    ConnectionFailedError,
    EngineError,
    EnvExecutionError,
    EnvTimeoutError,
    EnvValidationError,
    FactoryError,
    OpenEnvError,
    ProtocolError,
    ServerError,
    SessionClosedError,
    SessionError,
)
from openenv.protocol import CloseCode, ErrorCode
from openenv.runtime import (
    Agent,
    EngineName,
    EpisodeSession,
    ParallelizableAgent,
    RandomAgent,
    RunConfig,
    Runners,
    RuntimeEngine,
    Task,
    TaskResult,
    TaskStatus,
    exec_tasks,
)
from openenv.types import Action, EnvironmentMetadata, Observation, State, StepResult

if TYPE_CHECKING:
    from openenv.server import ConcurrencyConfig, ServerSettings, create_app

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Agent",
    "AnyObservation",
    "CapacityError",
    "CloseCode",
    "ConcurrencyConfig",
    "ConcurrencyConfigurationError",
    "ConnectionFailedError",
    "EngineError",
    "EngineName",
    "EnvClient",
    "EnvExecutionError",
    "EnvTimeoutError",
    "EnvValidationError",
    "Environment",
    "EnvironmentMetadata",
    "EpisodeSession",
    "ErrorCode",
    "FactoryError",
    "Observation",
    "OpenEnvError",
    "ParallelizableAgent",
    "ProtocolError",
    "RandomAgent",
    "RunConfig",
    "Runners",
    "RuntimeEngine",
    "ServerError",
    "ServerSettings",
    "SessionClosedError",
    "SessionError",
    "State",
    "StepResult",
    "SyncEnvClient",
    "Task",
    "TaskResult",
    "TaskStatus",
    "WebSocketEnvClient",
    "create_app",
    "exec_tasks",
]

_LAZY = {
    "ConcurrencyConfig": "openenv.server",
    "ServerSettings": "openenv.server",
    "create_app": "openenv.server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'openenv' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
