"""The JSON shapes of the HTTP routes beside ``/ws``: health, splits, task pages, environments.

Shared by the server (``server/routes.py``, ``server/catalog.py``,
``server/multi.py``, ``fleet.py``) and the clients (``client/remote.py``,
``client/pool.py``); ``openenv.protocol`` re-exports them, as the one place the
wire is defined.

>>> page = TaskPage(split="train", offset=0, limit=2, total=1, tasks=[], next_offset=None)
>>> page.model_dump_json()
'{"split":"train","offset":0,"limit":2,"total":1,"tasks":[],"next_offset":null}'
"""

from __future__ import annotations

from pydantic import BaseModel, Field, NonNegativeInt, SerializeAsAny

from openenv.tasks import TaskSpec
from openenv.types import EnvironmentMetadata

__all__ = [
    "EnvInfo",
    "EnvListing",
    "Health",
    "MultiHealth",
    "ReplicaHealth",
    "ReplicaList",
    "SplitList",
    "TaskPage",
]


class Health(BaseModel):
    """``GET /health``: whether the server takes sessions, and how full it is.

    Clients that place sessions read it (``ServerPool``, a fleet's directory), so
    every field has the default a bare ``{"status": "healthy"}`` (OpenEnv's
    servers) means, and a reply that does not fit this shape at all is a server
    to pass over, not one to trust.

    >>> Health.model_validate_json(b'{"status": "healthy"}').max_sessions
    0
    >>> Health.model_validate_json(b'{"max_sessions": -1}')
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for Health
    ...
    """

    status: str = Field(
        default="healthy",
        description='"healthy"; "degraded" (see reason) still takes sessions, only slower; '
        '"draining", and a fleet\'s replica "starting" or "down", do not.',
    )
    active_sessions: NonNegativeInt = Field(default=0, description="Sessions holding a slot.")
    max_sessions: NonNegativeInt = Field(default=0, description="Slots in all (the cap).")
    queued_sessions: NonNegativeInt = Field(default=0, description="Sessions waiting for a slot.")
    protocol_version: int = Field(
        default=1, description="The /ws protocol's version (v2 is the subprotocol openenv.v2)."
    )
    workers: int = Field(default=1, description="Worker processes sharing the cap.")
    reason: str | None = Field(default=None, description='Why the status is "degraded".')


class MultiHealth(Health):
    """``GET /health`` of a server of several environments (``create_multi_app``):
    the sums over them, and each one's own ``/health``."""

    envs: dict[str, Health] = Field(
        default_factory=dict, description="Each environment's /health, by name."
    )


class ReplicaHealth(Health):
    """One replica of a fleet, as its directory last saw it."""

    url: str = Field(description="The replica's own HTTP root.")
    node: str = Field(default="", description="The Ray node it runs on.")
    pid: int = Field(default=0, description="Its server's process id.")


class ReplicaList(BaseModel):
    """``GET /replicas`` of a fleet's directory (``openenv serve --ray``)."""

    replicas: list[ReplicaHealth]


class SplitList(BaseModel):
    """``GET /splits``."""

    splits: list[str]


class TaskPage(BaseModel):
    """``GET /tasks?split=&offset=&limit=``: one page of a split's tasks."""

    split: str
    offset: int
    limit: int
    total: int
    tasks: list[SerializeAsAny[TaskSpec]]
    next_offset: int | None = Field(description="Offset of the next page; null on the last one.")


class EnvInfo(BaseModel):
    """One environment of a multi-environment server."""

    name: str
    path: str = Field(description="Where its routes live, e.g. /envs/counter (its socket: .../ws).")
    metadata: EnvironmentMetadata
    active_sessions: int
    max_sessions: int
    splits: list[str]
    tools: list[str]


class EnvListing(BaseModel):
    """``GET /envs``."""

    envs: list[EnvInfo]
