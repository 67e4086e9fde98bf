"""``RunConfig``: which engine runs the tasks, and how.

>>> RunConfig(engine_name="ray", worker_num=4).engine_name
<EngineName.RAY: 'ray'>
>>> RunConfig(engine_name="rey")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for RunConfig
engine_name
  Value error, unknown engine 'rey'; choose one of local, ray, spark (did you mean 'ray'?)...
"""

from __future__ import annotations

import difflib
import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from openenv.runtime.base import RuntimeEngine
from openenv.trajectories import RecordFolder

__all__ = ["EngineName", "RunConfig"]


class EngineName(enum.StrEnum):
    """The built-in engines."""

    LOCAL = "local"
    RAY = "ray"
    SPARK = "spark"


class RunConfig(BaseModel):
    """How to run a list of tasks. The same tasks run on every engine unchanged.

    Args:
        engine_name: ``local`` (asyncio, or worker processes), ``ray`` or ``spark``.
        worker_num: Worker processes (local), Ray tasks, or Spark partitions.
        max_concurrency: Episodes in flight per worker. Keep the total within
            the server's session cap (``max_concurrent_envs``): an episode
            refused for capacity is retried, then fails with ``CapacityError``.
        sequence_dependent: Run the tasks one after another, in order; each
            agent sees the previous task's result as ``session.previous``, and
            a task with no ``input`` of its own reads the previous answer (or
            failure message) as ``session.input``, as AWorld chains them.
        reuse_process: AWorld's switch for the local engine. ``False``: play
            the tasks in ``worker_num`` worker processes, even one; ``True``:
            in this process, whatever ``worker_num``. ``None`` (the default):
            in this process when ``worker_num`` is 1, else in processes.
            Other engines ignore it, as AWorld's do.
        in_local: Run a distributed engine on this machine (Ray: a fresh local
            cluster; Spark: ``local[worker_num]``), for development and tests.
        cls: A ``RuntimeEngine`` subclass to use instead of the named engine.
        timeout: Seconds each task may take, retries included (a task's own
            ``timeout`` wins); ``None``: no limit.
        retries: Extra attempts after a connection-level failure (could not
            connect, server at capacity, connection dropped). Other failures
            are never retried.
        retry_backoff: Seconds before the first retry; doubles each time.
        progress: Show a progress bar; ``None``: when stderr is a terminal.
        record: A folder (a ``str`` or a ``Path``) to record every episode
            into, step by step, as JSON Lines (one file per process; see
            ``openenv.runtime.recording``); ``openenv.trajectories.load(folder)``
            reads it back. A folder that cannot be written to is a
            ``ValueError`` before any task starts.
        multiplex: Drive served environments over a few shared connections
            (openenv's protocol v2: many sessions per connection, their
            requests gathered into frames) when the server speaks it, else
            one connection per session as before; ``False``: always one per
            session.
        engine_options: Engine-specific settings: Ray ``.options()`` (e.g.
            ``num_cpus``, ``resources``) or Spark configuration entries.
        start_timeout: Seconds a worker may take to start (a Ray actor to be
            placed and call in, a Spark job to be scheduled, a process to come
            up) before that start counts as failed; after three in a row the
            tasks no worker played fail, saying why. ``None``: wait, as on a
            cluster that an autoscaler grows.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine_name: EngineName = EngineName.LOCAL
    worker_num: int = Field(default=1, ge=1)
    max_concurrency: int = Field(default=64, ge=1)
    sequence_dependent: bool = False
    reuse_process: bool | None = None
    in_local: bool = False
    cls: type[RuntimeEngine] | None = None
    timeout: float | None = Field(default=None, gt=0)
    retries: int = Field(default=2, ge=0)
    retry_backoff: float = Field(default=0.1, ge=0)
    progress: bool | None = None
    engine_options: dict[str, Any] = Field(default_factory=dict)
    record: RecordFolder | None = None
    multiplex: bool = True
    start_timeout: float | None = Field(default=None, gt=0)

    @field_validator("engine_name", mode="before")
    @classmethod
    def _known_engine(cls, value: object) -> object:
        if isinstance(value, str) and not isinstance(value, EngineName):
            names = [e.value for e in EngineName]
            if value.lower() not in names:
                hint = difflib.get_close_matches(value.lower(), names, n=1)
                suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise ValueError(
                    f"unknown engine {value!r}; choose one of {', '.join(names)}{suggestion}, "
                    f"or pass a RuntimeEngine subclass as cls="
                )
            return value.lower()
        return value
