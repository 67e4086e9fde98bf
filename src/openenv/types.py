"""The data an environment exchanges with its agents: actions, observations, state.

Every class here is a pydantic v2 model, so an environment's wire schema, its
validation and its documentation all come from one declaration.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

__all__ = [
    "Action",
    "EnvironmentMetadata",
    "Observation",
    "State",
    "StepResult",
]


class Action(BaseModel):
    """Base class for what an agent sends to an environment.

    Unknown fields are rejected so that a typo in an agent's action is a
    validation error instead of a silently ignored field. ``metadata`` is the
    one free-form field, as in OpenEnv, whose clients send it with every action.

    >>> class Move(Action):
    ...     direction: str
    >>> Move(direction="up").direction
    'up'
    >>> Move(direction="up", metadata={"turn": 3}).metadata
    {'turn': 3}
    >>> list(Move.model_json_schema()["properties"])
    ['direction']
    >>> Move(direction="up").model_dump()
    {'direction': 'up'}
    """

    # NaN and ±inf kept as floats in a JSON-mode dump, Any-typed values too
    # (else None), for frames to write as "NaN", "Infinity" and "-Infinity".
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    # Kept out of the JSON Schema (forms, MCP tool schemas and sampled actions
    # describe only what the environment reads) and out of dumps while empty
    # (frames and recordings stay as they were before the field existed).
    metadata: SkipJsonSchema[dict[str, Any]] = Field(
        default_factory=dict,
        description="Free-form extra data; environments may ignore it.",
        exclude_if=lambda value: not value,
    )


class Observation(BaseModel):
    """Base class for what an environment returns from ``reset`` and ``step``.

    The reward and the end-of-episode flag travel with the observation, so a
    step result is one object rather than a Gym tuple.

    >>> class Seen(Observation):
    ...     text: str
    >>> Seen(text="hi", reward=1.0, done=True).done
    True

    ``dump_mode`` says how a reply frame dumps the fields: ``"json"`` (pydantic's
    JSON mode, the default) or ``"python"`` (pydantic's python mode: nested models
    become dicts, and values pydantic does not know stay as they are, for orjson to
    encode). The latter suits fields orjson writes itself, such as numpy arrays (no
    ``tolist()``, and float32 written as float32); give those a JSON-mode serializer
    too, for ``model_dump(mode="json")`` (``VectorObservation`` of
    ``openenv.adapters.gymnasium`` does both).
    """

    # As Action's: NaN and ±inf reach frames as floats, to be written as text.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")
    dump_mode: ClassVar[Literal["json", "python"]] = "json"

    reward: float | None = Field(default=None, description="Reward for the last action.")
    done: bool = Field(default=False, description="Whether the episode has ended.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form extra data.")


class State(BaseModel):
    """An environment's episode bookkeeping; subclasses add their own fields.

    >>> State(episode_id="e1", step_count=3, level=2).model_dump()
    {'episode_id': 'e1', 'step_count': 3, 'level': 2}
    """

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = Field(default=None, description="Identifier of the current episode.")
    step_count: int = Field(default=0, ge=0, description="Steps taken in the current episode.")


ObsT = TypeVar("ObsT", bound=Observation)


class StepResult(BaseModel, Generic[ObsT]):
    """What a client gets back from ``reset`` and ``step``.

    >>> class Seen(Observation):
    ...     text: str
    >>> StepResult[Seen](observation=Seen(text="hi"), reward=0.5, done=False).reward
    0.5
    """

    observation: ObsT
    reward: float | None = None
    done: bool = False


class EnvironmentMetadata(BaseModel):
    """What ``GET /metadata`` says about an environment.

    >>> EnvironmentMetadata(name="echo", description="Echoes messages.").name
    'echo'
    """

    name: str
    description: str = ""
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None
    readme_content: str | None = None
    supports_concurrent_sessions: bool = False
