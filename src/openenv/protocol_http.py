"""The JSON shapes of the HTTP routes beside ``/ws``: splits, task pages, environments.

Shared by the server (``server/catalog.py``, ``server/multi.py``) and the
clients (``client/remote.py``); ``openenv.protocol`` re-exports them, as the
one place the wire is defined.

>>> page = TaskPage(split="train", offset=0, limit=2, total=1, tasks=[], next_offset=None)
>>> page.model_dump_json()
'{"split":"train","offset":0,"limit":2,"total":1,"tasks":[],"next_offset":null}'
"""

from __future__ import annotations

from pydantic import BaseModel, Field, SerializeAsAny

from openenv.tasks import TaskSpec
from openenv.types import EnvironmentMetadata

__all__ = ["EnvInfo", "EnvListing", "SplitList", "TaskPage"]


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
