"""``openenv.core.client_types``: OpenEnv 0.10's ``StepResult``, with its ``metadata``."""

from __future__ import annotations

from typing import Any, Generic

from openenv.client._base import ObsT
from openenv.types import StepResult as _StepResult

__all__ = ["StepResult"]


class StepResult(_StepResult[ObsT], Generic[ObsT]):
    """What ``reset``/``step`` return, plus the reply's ``metadata`` (OpenEnv's field).

    >>> from openenv import Observation
    >>> StepResult(observation=Observation(), reward=1.0, metadata={"k": 1}).metadata
    {'k': 1}
    """

    metadata: dict[str, Any] | None = None
