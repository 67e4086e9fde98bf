# SPDX-License-Identifier: BSD-3-Clause

"""
Data models for the Oe Echo Environment.

The oe_echo environment is a simple test environment that echoes back messages.
"""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class OeEchoAction(Action):
    """Action for the Oe Echo environment - just a message to echo."""

    message: str = Field(..., description="Message to echo back")


class OeEchoObservation(Observation):
    """Observation from the Oe Echo environment - the echoed message."""

    echoed_message: str = Field(default="", description="The echoed message")
    message_length: int = Field(default=0, description="Length of the echoed message")
