"""``openenv.core.env_client``: OpenEnv 0.10's ``EnvClient``, on openenv's client.

A client written for OpenEnv subclasses ``EnvClient[Act, Obs, State]`` and
overrides ``_step_payload``, ``_parse_result`` and ``_parse_state``; those
hooks are honoured here, so its payloads and its ``StepResult`` (with
``metadata``) are exactly what it would get from OpenEnv. Everything else is
``openenv.EnvClient``: blocking without a running event loop, awaitable inside
one, ``.sync()``, ``with``/``async with``, OpenEnv's constructor options. As
OpenEnv's, ``step`` takes (and ignores) extra keywords, and ``disconnect()``
ends the session while the client stays usable: its next call opens a new one.
"""

from __future__ import annotations

import typing
from typing import Any

from openenv import protocol
from openenv.client._base import ActT, ObsT, StateT
from openenv.client.async_ import EnvClient as _EnvClient
from openenv.client.loop_aware import loop_aware
from openenv.core.client_types import StepResult

__all__ = ["EnvClient"]


class EnvClient(_EnvClient[ActT, ObsT, StateT]):
    """OpenEnv's client base class; see the module docstring.

    >>> from openenv.core import EnvClient
    >>> from openenv.core.env_server.types import State
    >>> from echo_env.models import EchoAction, EchoObservation
    >>> class EchoEnv(EnvClient[EchoAction, EchoObservation, State]):
    ...     def _step_payload(self, action):
    ...         return {"message": action.message}
    >>> env = EchoEnv(base_url="http://localhost:8000")
    >>> env.encode_action(EchoAction(message="hi")), env.base_url
    ({'message': 'hi'}, 'http://localhost:8000')
    """

    def _step_payload(self, action: ActT) -> dict[str, Any]:
        """The ``step`` frame's data for ``action`` (default: all its fields)."""
        return action.model_dump(mode="json")

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ObsT]:
        """A ``StepResult`` from an ``observation`` reply's data."""
        data = protocol.ObservationPayload.model_validate(payload)
        observation = protocol.observation_from_payload(self.observation_cls, data)
        return StepResult(
            observation=typing.cast(ObsT, observation),
            reward=data.reward,
            done=data.done,
            metadata=data.metadata,
        )

    def _parse_state(self, payload: dict[str, Any]) -> StateT:
        """The ``State`` from a ``state`` reply's data."""
        return typing.cast(StateT, self.state_cls.model_validate(payload))

    @loop_aware
    async def step(self, /, action: ActT | dict[str, Any], **kwargs: Any) -> StepResult[ObsT]:
        """Step the environment; keywords are accepted and ignored, as OpenEnv's are."""
        return await super().step(action)  # type: ignore[return-value]

    @loop_aware
    async def disconnect(self) -> None:
        """End the session (the server closes its environment and frees its slot);
        the client stays usable, and its next call opens a new session, as after
        OpenEnv's ``disconnect()``. ``close()`` ends the client for good."""
        if self._closed:
            return
        await self.close()
        self._closed = False

    def encode_action(self, action: ActT | dict[str, Any]) -> dict[str, Any]:
        if isinstance(action, dict):
            return action
        return self._step_payload(action)

    def decode_result(self, frame: str | bytes | dict[str, Any]) -> StepResult[ObsT]:
        reply = self._decode(frame, protocol.ObservationReply)
        payload = reply.data.model_dump(mode="json")
        # OpenEnv's server leaves the observation's metadata among its fields too,
        # and its clients' _parse_result read it there: obs_data.get("metadata", {}).
        # And sends the reply's own "metadata" only when there is some.
        payload["observation"].setdefault("metadata", payload["metadata"])
        if not payload["metadata"]:
            del payload["metadata"]
        return self._parse_result(payload)

    def decode_state(self, frame: str | bytes | dict[str, Any]) -> StateT:
        reply = self._decode(frame, protocol.StateReply)
        return self._parse_state(reply.data)
