"""What the echo environment's agents send and receive."""

from openenv import Action, Observation
from pydantic import Field


class EchoAction(Action):
    """A message to echo back."""

    message: str = Field(description="The message to echo back.")


class EchoObservation(Observation):
    """The echoed message and its length."""

    echoed_message: str = Field(default="", description="The last message sent.")
    message_length: int = Field(default=0, ge=0, description="Its length in characters.")
