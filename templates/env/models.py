"""What __env_name__'s agents send (the action) and receive (the observation).

Both are pydantic models: their fields are the wire format, the validation and
the JSON Schema that ``GET /schema`` serves, all at once.
"""

from openenv import Action, Observation
from pydantic import Field


class __Prefix__Action(Action):
    """A guess at the hidden number."""

    guess: int = Field(ge=0, le=99, description="A number from 0 to 99.")


class __Prefix__Observation(Observation):
    """A hint after each guess; ``reward`` and ``done`` come with every observation."""

    hint: str = Field(default="", description='"higher", "lower" or "correct".')
    guesses_left: int = Field(default=0, ge=0, description="Guesses before the episode ends.")
