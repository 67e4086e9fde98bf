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

The server half (``create_app`` and friends) and the runtime (``Runners``
and friends) are imported on first use: training code that only drives
environments never imports FastAPI, and a server starts without the runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from openenv._renamed import old_name as _old_name
from openenv.client import (
    AnyObservation,
    EnvClient,
    EnvSession,
    MultiEnvClient,
    MuxClient,
    MuxSession,
    RemoteEnv,
    ServerPool,
    SyncEnvClient,
    SyncEnvSession,
    SyncMultiEnvClient,
    SyncRemoteEnv,
    TRLEnv,
    WebSocketEnvClient,
)
from openenv.environment import Environment
from openenv.errors import (
    AuthenticationError,
    CapacityError,
    ConcurrencyConfigurationError,
    ConnectionFailedError,
    DeadlineError,
    EngineError,
    EnvError,
    EnvExecutionError,
    EnvTimeoutError,
    EnvValidationError,
    EpisodeFinishedError,
    FactoryError,
    NotFoundError,
    OpenEnvError,
    ProtocolError,
    RequestFailedError,
    ServerError,
    SessionClosedError,
    SessionError,
    UnknownToolError,
)
from openenv.protocol import CloseCode, EnvInfo, ErrorCode, TaskPage
from openenv.rubrics import Gate, Max, Rubric, Sequential, TrajectoryRubric, WeightedSum
from openenv.tasks import TaskSpec
from openenv.tools import (
    ImageContent,
    JsonContent,
    TextContent,
    ToolInfo,
    ToolOutput,
    tool,
)
from openenv.types import Action, EnvironmentMetadata, Observation, State, StepResult

if TYPE_CHECKING:
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
    from openenv.server import (
        ConcurrencyConfig,
        EnvSpec,
        ServerSettings,
        create_app,
        create_multi_app,
        serve,
    )

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Agent",
    "AnyObservation",
    "AuthenticationError",
    "CapacityError",
    "CloseCode",
    "ConcurrencyConfig",
    "ConcurrencyConfigurationError",
    "ConnectionFailedError",
    "DeadlineError",
    "EngineError",
    "EngineName",
    "EnvClient",
    "EnvError",
    "EnvExecutionError",
    "EnvInfo",
    "EnvSession",
    "EnvSpec",
    "EnvTimeoutError",
    "EnvValidationError",
    "Environment",
    "EnvironmentMetadata",
    "EpisodeFinishedError",
    "EpisodeSession",
    "ErrorCode",
    "FactoryError",
    "Gate",
    "ImageContent",
    "JsonContent",
    "Max",
    "MultiEnvClient",
    "MuxClient",
    "MuxSession",
    "NotFoundError",
    "Observation",
    "OpenEnvError",
    "ParallelizableAgent",
    "ProtocolError",
    "RandomAgent",
    "RemoteEnv",
    "RequestFailedError",
    "Rubric",
    "RunConfig",
    "Runners",
    "RuntimeEngine",
    "Sequential",
    "ServerError",
    "ServerPool",
    "ServerSettings",
    "SessionClosedError",
    "SessionError",
    "State",
    "StepResult",
    "SyncEnvClient",
    "SyncEnvSession",
    "SyncMultiEnvClient",
    "SyncRemoteEnv",
    "TRLEnv",
    "Task",
    "TaskPage",
    "TaskResult",
    "TaskSpec",
    "TaskStatus",
    "TextContent",
    "ToolInfo",
    "ToolOutput",
    "TrajectoryRubric",
    "UnknownToolError",
    "WebSocketEnvClient",
    "WeightedSum",
    "create_app",
    "create_multi_app",
    "exec_tasks",
    "serve",
    "tool",
]

_LAZY = {
    **dict.fromkeys(
        [
            "Agent",
            "EngineName",
            "EpisodeSession",
            "ParallelizableAgent",
            "RandomAgent",
            "RunConfig",
            "Runners",
            "RuntimeEngine",
            "Task",
            "TaskResult",
            "TaskStatus",
            "exec_tasks",
        ],
        "openenv.runtime",
    ),
    "ConcurrencyConfig": "openenv.server",
    "EnvSpec": "openenv.server",
    "ServerSettings": "openenv.server",
    "create_app": "openenv.server",
    "create_multi_app": "openenv.server",
    "serve": "openenv.server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        return _old_name(__name__, name, globals())
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
