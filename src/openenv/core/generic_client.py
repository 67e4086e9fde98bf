"""``openenv.core.generic_client``: OpenEnv's ``GenericEnvClient``, on openenv's client.

A client for any environment without its package installed: actions are
dicts, observations stay dicts, the state is the server's dict.

>>> from openenv.core import GenericAction, GenericEnvClient
>>> GenericAction(message="hi")
GenericAction(message='hi')
>>> env = GenericEnvClient(base_url="http://localhost:8000")
>>> env.encode_action(GenericAction(message="hi")) == {"message": "hi"}
True
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

__all__ = ["GenericAction", "GenericEnvClient"]


class GenericEnvClient(EnvClient[Any, Any, Any]):
    """OpenEnv's client of plain dicts: ``env.step({"message": "hi"}).observation["text"]``."""

    def _step_payload(self, action: Any) -> dict[str, Any]:
        if isinstance(action, dict):
            return action
        if hasattr(action, "model_dump"):
            return dict(action.model_dump())
        return dict(vars(action))

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Any]:
        return StepResult(
            observation=payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> Any:
        return payload


class GenericAction(dict[str, Any]):
    """A dict made from keywords, for ``GenericEnvClient.step``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(kwargs)

    def __repr__(self) -> str:
        items = ", ".join(f"{key}={value!r}" for key, value in self.items())
        return f"GenericAction({items})"
