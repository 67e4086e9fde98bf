# SPDX-License-Identifier: BSD-3-Clause

"""Oe Echo Environment Client."""

from typing import Dict

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import State

from .models import OeEchoAction, OeEchoObservation


class OeEchoEnv(
    EnvClient[OeEchoAction, OeEchoObservation, State]
):
    """
    Client for the Oe Echo Environment.

    This client maintains a persistent WebSocket connection to the environment server,
    enabling efficient multi-step interactions with lower latency.
    Each client instance has its own dedicated environment session on the server.

    Example:
        >>> # Connect to a running server (.sync() for sync use)
        >>> with OeEchoEnv(base_url="http://localhost:8000").sync() as client:
        ...     result = client.reset()
        ...     print(result.observation.echoed_message)
        ...
        ...     result = client.step(OeEchoAction(message="Hello!"))
        ...     print(result.observation.echoed_message)

    Example with Docker:
        >>> # Automatically start container and connect (.sync() for sync use)
        >>> client = OeEchoEnv.from_docker_image("oe_echo:latest").sync()
        >>> try:
        ...     result = client.reset()
        ...     result = client.step(OeEchoAction(message="Test"))
        ... finally:
        ...     client.close()
    """

    def _step_payload(self, action: OeEchoAction) -> Dict:
        """
        Convert OeEchoAction to JSON payload for step message.

        Args:
            action: OeEchoAction instance

        Returns:
            Dictionary representation suitable for JSON encoding
        """
        return {
            "message": action.message,
        }

    def _parse_result(self, payload: Dict) -> StepResult[OeEchoObservation]:
        """
        Parse server response into StepResult[OeEchoObservation].

        Args:
            payload: JSON response data from server

        Returns:
            StepResult with OeEchoObservation
        """
        obs_data = payload.get("observation", {})
        observation = OeEchoObservation(
            echoed_message=obs_data.get("echoed_message", ""),
            message_length=obs_data.get("message_length", 0),
            done=payload.get("done", False),
            reward=payload.get("reward"),
            metadata=payload.get("metadata", obs_data.get("metadata", {})),
        )

        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: Dict) -> State:
        """
        Parse server response into State object.

        Args:
            payload: JSON response from state request

        Returns:
            State object with episode_id and step_count
        """
        return State(
            episode_id=payload.get("episode_id"),
            step_count=payload.get("step_count", 0),
        )
