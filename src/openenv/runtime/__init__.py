"""Run many episodes (a task x an agent) in parallel: in process, on local processes, Ray or Spark.

>>> from openenv.runtime import RandomAgent, RunConfig, Runners, Task
>>> from echo_env.server.environment import EchoEnvironment
>>> tasks = [Task(id=f"t{i}", env=EchoEnvironment, agent=RandomAgent(seed=0), seed=i,
...               max_steps=5) for i in range(4)]
>>> results = Runners.sync_run_task(tasks, RunConfig(engine_name="local"))
>>> [(r.status.value, r.steps) for r in results]
[('ok', 5), ('ok', 5), ('ok', 5), ('ok', 5)]

Switch engines with ``RunConfig(engine_name="ray", worker_num=8)`` or
``"spark"``; the tasks and agents stay the same. Ray and pyspark are
imported only when their engine is chosen.
"""

from openenv.runtime.agents import Agent, AgentFunction
from openenv.runtime.base import BatchSettings, RuntimeEngine
from openenv.runtime.config import EngineName, RunConfig
from openenv.runtime.local import LocalRuntime
from openenv.runtime.parallel import ParallelizableAgent
from openenv.runtime.random_agent import RandomAgent
from openenv.runtime.runners import Runners, exec_tasks, sync_exec_tasks
from openenv.runtime.session import EpisodeSession
from openenv.runtime.task import (
    EnvFactory,
    Task,
    TaskError,
    TaskResult,
    TaskResults,
    TaskStatus,
)

__all__ = [
    "Agent",
    "AgentFunction",
    "BatchSettings",
    "EngineName",
    "EnvFactory",
    "EpisodeSession",
    "LocalRuntime",
    "ParallelizableAgent",
    "RandomAgent",
    "RunConfig",
    "Runners",
    "RuntimeEngine",
    "Task",
    "TaskError",
    "TaskResult",
    "TaskResults",
    "TaskStatus",
    "exec_tasks",
    "sync_exec_tasks",
]
