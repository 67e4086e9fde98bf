"""``openenv.core.client_types``: OpenEnv 0.10's ``StepResult``, with its ``metadata``."""

from __future__ import annotations

from typing import Any, Generic

from pydantic import SkipValidation

from openenv.client._base import ObsT
from openenv.types import StepResult as _StepResult

__all__ = ["StepResult"]


class StepResult(_StepResult[ObsT], Generic[ObsT]):
    """What ``reset``/``step`` return, plus the reply's ``metadata`` (OpenEnv's field).

    OpenEnv's is a dataclass, and clients written for it build one as such:
    positionally, and with any observation (a dict, as OpenEnv's generic client
    has), which is kept as given.

    >>> from openenv import Observation
    >>> StepResult(observation=Observation(), reward=1.0, metadata={"k": 1}).metadata
    {'k': 1}
    >>> StepResult({"text": "hi"}, 0.5, True).observation
    {'text': 'hi'}
    """

    observation: SkipValidation[ObsT]
    metadata: dict[str, Any] | None = None

    def __init__(
        self,
        observation: ObsT,
        reward: float | None = None,
        done: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(observation=observation, reward=reward, done=done, metadata=metadata)
