"""A ``gymnasium.vector.VectorEnv`` whose environments live on a server.

``RemoteVectorEnv`` opens ``num_envs`` sessions on one connection (protocol
v2, ``openenv/protocol_v2.py``) to an app made by ``create_gymnasium_app``
and steps them all with one frame each way (a frame per 4,096 past that,
the most a server takes in one by default). Spaces come from the server, so
Gymnasium-style training code swaps it in for a ``SyncVectorEnv`` unchanged:

>>> from openenv.adapters.gymnasium import RemoteVectorEnv
>>> def rollout(url: str, steps: int = 100) -> float:
...     envs = RemoteVectorEnv(url, num_envs=64)  # e.g. envs/gymnasium_env serving CartPole-v1
...     observations, infos = envs.reset(seed=42)  # observations.shape == (64, 4)
...     total = 0.0
...     for _ in range(steps):
...         actions = envs.action_space.sample()
...         observations, rewards, terminations, truncations, infos = envs.step(actions)
...         total += float(rewards.sum())
...     envs.close()  # frees the 64 slots
...     return total

Autoreset follows ``SyncVectorEnv`` (``autoreset_mode``: next step by
default, same step, or disabled), and ``reset(seed=s)`` seeds environment
``i`` with ``s + i`` as it does, so a seeded run gives the same episodes
in-process and remote.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from typing import Any

import gymnasium
import httpx
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from pydantic import TypeAdapter, ValidationError

from openenv.adapters.gymnasium.environment import SPACES_ROUTE
from openenv.adapters.gymnasium.spaces import action_annotation, from_json, jsonable, rebuild
from openenv.adapters.gymnasium.vector_link import (
    VectorLink,
    decode_infos,
    final_observations,
    refuse_unreset,
    stack_lists,
)
from openenv.adapters.gymnasium.vector_sessions import Request, SessionsLink
from openenv.client._base import (
    auth_headers,
    http_detail,
    http_url,
    ssl_context,
)
from openenv.errors import (
    AuthenticationError,
    ConnectionFailedError,
    SessionClosedError,
    server_error,
)
from openenv.protocol import ErrorCode

__all__ = ["DEFAULT_BUSY_POLL", "RemoteVectorEnv"]

# Seconds a RemoteVectorEnv waits for a reply without sleeping (``busy_poll``).
DEFAULT_BUSY_POLL = 0.002


class RemoteVectorEnv(VectorEnv[Any, Any, Any]):
    """``num_envs`` remote environments behind Gymnasium's vector API.

    It fails as the other clients do: a refused handshake is a
    ``ConnectionFailedError`` (``AuthenticationError``, ``CapacityError``), a
    call without its replies within ``timeout`` an ``EnvTimeoutError``, and a
    dropped connection, a reply that is not the protocol, or a frame the server
    refuses whole (more requests than its ``max_requests_in_flight``; each of
    these closes the connection), a ``SessionClosedError``.

    Args:
        base_url: A server running ``create_gymnasium_app`` (or ``envs/gymnasium_env``).
        num_envs: Sessions to open; each takes a slot of the server's cap.
        autoreset_mode: As ``SyncVectorEnv``'s (default: ``NEXT_STEP``).
        copy: Return copies of the observation arrays (as ``SyncVectorEnv``).
        timeout: Seconds to wait for the replies of one call (then ``EnvTimeoutError``).
        connect_timeout: Seconds to open the connection; also the most ``close()``
            waits for the server to close the sessions before it hangs up (the
            server frees their slots all the same), as for the other clients.
        api_key: Sent as a Bearer token (default: ``$OPENENV_API_KEY``).
        busy_poll: Seconds to wait for a reply without sleeping, while replies
            usually come that soon (0: always sleep). A quick environment's
            replies come sooner when the waiting core never sleeps (on
            CartPole x64, 15% more steps per second); a slower one's replies
            take longer than this, and nothing is polled.
    """

    def __init__(
        self,
        base_url: str,
        num_envs: int,
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        api_key: str | None = None,
        busy_poll: float = DEFAULT_BUSY_POLL,
    ) -> None:
        # First: Gymnasium's __del__ closes a half-made env too.
        self._sessions: SessionsLink | None = None
        self._link: VectorLink | None = None
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        if not isinstance(base_url, str) or "," in base_url:  # a ServerPool, or a pool's URLs
            raise ValueError(
                f"RemoteVectorEnv steps its environments on one server, not a pool "
                f"({base_url!r}); make one per server"
            )
        self.num_envs = num_envs
        self.copy = copy
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.timeout = timeout
        headers = auth_headers(api_key=api_key)
        described = _spaces(http_url(base_url), headers, timeout)
        self.single_action_space = rebuild(described["action_space"])
        self.single_observation_space = rebuild(described["observation_space"])
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.metadata = {"autoreset_mode": self.autoreset_mode}
        # Actions are checked here as the server checks them (``_checked``).
        batch: Any = list[action_annotation(self.single_action_space)]  # type: ignore[misc]
        self._actions: TypeAdapter[list[Any]] = TypeAdapter(batch)
        self._box = isinstance(self.single_observation_space, gymnasium.spaces.Box)
        self._observations: Any = create_empty_array(self.single_observation_space, num_envs)
        self._rewards = np.zeros((num_envs,), dtype=np.float64)
        self._terminations = np.zeros((num_envs,), dtype=np.bool_)
        self._truncations = np.zeros((num_envs,), dtype=np.bool_)
        self._autoreset_envs = np.zeros((num_envs,), dtype=np.bool_)
        vector = described.get("vector")
        if vector is not None:  # a create_gymnasium_vector_app server: one session steps all
            self._link = VectorLink(
                base_url,
                headers,
                timeout,
                num_envs,
                self.autoreset_mode,
                vector["max_envs"],
                busy_poll,
                connect_timeout,
            )
            return
        self._sessions = SessionsLink(
            base_url, headers, timeout, num_envs, busy_poll, connect_timeout
        )

    # -- the vector API ----------------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every environment (or those of ``options["reset_mask"]``)."""
        if options and "reset_mask" in options:
            _check_mask(options["reset_mask"], self.num_envs)
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:  # before either kind of server hears of it
            raise ValueError(f"{len(seeds)} seeds for num_envs={self.num_envs}")
        if self._link is not None:
            batch = self._batched(self._link.reset(seed, _listed(options)))
            self._autoreset_envs[(options or {}).get("reset_mask", slice(None))] = False
            return batch
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is None:
            mask = np.ones((self.num_envs,), dtype=np.bool_)
        requests: list[Request] = [
            ("reset", _reset_data(s, options)) if m else None
            for s, m in zip(seeds, mask, strict=True)
        ]
        replies = self._exchange(requests)
        self._terminations[mask] = False
        self._truncations[mask] = False
        self._autoreset_envs[mask] = False
        infos: dict[str, Any] = {}
        observations: list[Any] = []
        for i, reply in enumerate(replies):
            if reply is None:
                observations.append(None)
                continue
            payload = reply["data"]["observation"]
            observations.append(payload["observation"])
            infos = self._add_info(infos, payload.get("info") or {}, i)
        self._store(observations)
        return self._out(), stack_lists(infos)

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step every environment with its action (autoresetting as ``SyncVectorEnv``)."""
        refuse_unreset(self.autoreset_mode, self._autoreset_envs)
        if self._link is not None:
            fields = self._link.step(actions)
            batch, batch_infos = self._batched(fields)
            terminations = np.asarray(fields["terminations"], dtype=np.bool_)
            truncations = np.asarray(fields["truncations"], dtype=np.bool_)
            self._autoreset_envs = terminations | truncations
            rewards = np.asarray(fields["rewards"], dtype=np.float64)
            return batch, rewards, terminations, truncations, batch_infos
        values = self._checked(actions)
        requests: list[Request] = []
        next_step = self.autoreset_mode is AutoresetMode.NEXT_STEP
        for i, value in enumerate(values):
            if next_step and self._autoreset_envs[i]:
                requests.append(("reset", {}))
            else:
                requests.append(("step", {"action": value}))
        # An environment's failure is raised once the others' results are taken:
        # they did step, and one whose episode ended then must be reset, or every
        # later step would be refused for it ("the episode is over").
        replies, error = self._answers(requests)
        infos: dict[str, Any] = {}
        observations: list[Any] = []
        again: list[int] = []
        for i, reply in enumerate(replies):
            if reply is None:  # its call failed: it keeps its last observation
                observations.append(None)
                continue
            data = reply["data"]
            payload = data["observation"]
            observations.append(payload["observation"])
            if next_step and self._autoreset_envs[i]:  # this call reset it
                self._rewards[i] = 0.0
                self._terminations[i] = self._truncations[i] = False
            else:
                self._rewards[i] = data["reward"] or 0.0
                self._terminations[i] = payload["terminated"]
                self._truncations[i] = payload["truncated"]
            info = payload.get("info") or {}
            if self.autoreset_mode is AutoresetMode.SAME_STEP and (
                self._terminations[i] or self._truncations[i]
            ):
                final = from_json(self.single_observation_space, payload["observation"])
                infos = self._add_info(infos, {"final_obs": final, "final_info": info}, i)
                again.append(i)
            else:
                infos = self._add_info(infos, info, i)
        if again:  # SAME_STEP: reset the finished ones now, in one more frame
            resets, failed = self._answers(
                [("reset", {}) if i in again else None for i in range(self.num_envs)]
            )
            error = error or failed
            for i in again:
                if (reset := resets[i]) is None:
                    continue
                payload = reset["data"]["observation"]
                observations[i] = payload["observation"]
                infos = self._add_info(infos, payload.get("info") or {}, i)
        self._store(observations)
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        if error is not None:
            raise error
        return (
            self._out(),
            np.copy(self._rewards),
            np.copy(self._terminations),
            np.copy(self._truncations),
            stack_lists(infos),
        )

    def close_extras(self, **kwargs: Any) -> None:
        """Close every session (freeing their slots) and the connection."""
        if self._link is not None:
            self._link.close()
        elif self._sessions is not None:
            self._sessions.close()

    # -- the wire ----------------------------------------------------------------

    def _exchange(self, requests: Sequence[Request]) -> list[dict[str, Any] | None]:
        """Every environment's request (``None``: nothing for it); replies in env order."""
        replies, error = self._answers(requests)
        if error is not None:
            raise error
        return replies

    def _answers(
        self, requests: Sequence[Request]
    ) -> tuple[list[dict[str, Any] | None], Exception | None]:
        """``_exchange``'s replies (``None`` where a request failed) and first error."""
        if self._sessions is None:
            raise SessionClosedError("this vector env is closed")
        return self._sessions.answers(requests)

    def _checked(self, actions: Any) -> list[Any]:
        """Every environment's action as JSON, each checked as the server will check it:
        a bad one is refused before any is sent, so no environment steps without the
        others (and loses its step's results). As in ``SyncVectorEnv``, the action of
        an environment that this step resets (``NEXT_STEP``) is ignored, unchecked."""
        values = [jsonable(action) for action in iterate(self.action_space, actions)]
        if len(values) != self.num_envs:
            raise ValueError(f"{len(values)} actions for num_envs={self.num_envs}")
        resets = self.autoreset_mode is AutoresetMode.NEXT_STEP
        stepping = [i for i in range(self.num_envs) if not (resets and self._autoreset_envs[i])]
        try:
            self._actions.validate_python([values[i] for i in stepping])
        except ValidationError as exc:
            raise _refused(exc, stepping) from None
        return values

    def _store(self, observations: list[Any]) -> None:
        space = self.single_observation_space
        if self._box and all(o is not None for o in observations):
            values = np.asarray(observations, dtype=space.dtype)
            self._observations = values.reshape(self._observations.shape)
            return
        kept = iterate(self.observation_space, self._observations)  # for envs not reset
        items = [
            from_json(space, o) if o is not None else own
            for o, own in zip(observations, kept, strict=True)
        ]
        self._observations = concatenate(space, items, self._observations)

    def _out(self) -> Any:
        return deepcopy(self._observations) if self.copy else self._observations

    def _batched(self, fields: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """A vector session's observations and infos as ``SyncVectorEnv`` returns them."""
        space = self.single_observation_space
        values = np.asarray(fields["observations"], dtype=space.dtype)
        self._observations = values.reshape(self.observation_space.shape)
        return self._out(), final_observations(decode_infos(fields.get("infos") or {}), space)


def _refused(exc: ValidationError, envs: list[int]) -> Exception:
    """``EnvValidationError`` for the actions of ``envs`` that ``exc`` refused, each
    located by its environment's index."""
    errors: list[dict[str, Any]] = []
    for e in exc.errors(include_url=False, include_context=False, include_input=False):
        index, *inner = e["loc"]
        errors.append({"loc": [envs[int(index)], *inner], "msg": e["msg"], "type": e["type"]})
    where = "; ".join(".".join(map(str, e["loc"])) + ": " + e["msg"] for e in errors)
    return server_error(ErrorCode.VALIDATION_ERROR, f"invalid actions: {where}", {"errors": errors})


def _check_mask(mask: Any, num_envs: int) -> None:
    """Refuse a ``reset_mask`` as ``SyncVectorEnv`` refuses it, before anything resets.

    An integer array would index environments rather than pick them, and one
    that picks none would be a reset that does nothing.
    """
    where = "`options['reset_mask']`"
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"{where} must be a numpy array, got {type(mask)}")
    if mask.shape != (num_envs,):
        raise ValueError(f"{where} must have shape `({num_envs},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"{where} must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(
            f"{where} must contain a boolean array with at least one True value, "
            f"got reset_mask={mask}"
        )


def _listed(options: dict[str, Any] | None) -> dict[str, Any] | None:
    """Reset options as JSON (a ``reset_mask`` array as a list)."""
    if not options or "reset_mask" not in options:
        return options
    return {**options, "reset_mask": np.asarray(options["reset_mask"]).tolist()}


def _reset_data(seed: int | None, options: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if seed is not None:
        data["seed"] = seed
    if options:
        data["options"] = options
    return data


def _spaces(base: str, headers: dict[str, str], timeout: float) -> dict[str, Any]:
    try:
        reply = httpx.get(
            base + SPACES_ROUTE, headers=headers, timeout=timeout, verify=ssl_context()
        )
    except httpx.HTTPError as exc:
        raise ConnectionFailedError(base, str(exc) or type(exc).__name__) from None
    if reply.status_code in (401, 403):
        raise AuthenticationError(base, http_detail(reply) or f"HTTP {reply.status_code}")
    if reply.status_code == 404:
        raise ConnectionFailedError(
            base, "no Gymnasium spaces there: serve the environment with create_gymnasium_app"
        )
    if reply.status_code != 200:
        raise ConnectionFailedError(base, f"HTTP {reply.status_code}: {http_detail(reply)}")
    try:
        described = reply.json()
    except ValueError:  # another service on that port: a web app answering every path
        described = None
    if not (
        isinstance(described, dict)
        and isinstance(described.get("action_space"), dict)
        and isinstance(described.get("observation_space"), dict)
    ):
        raise ConnectionFailedError(
            base,
            f"{SPACES_ROUTE} answered something other than Gymnasium spaces "
            f"({reply.text[:80]!r}); is this an openenv server made by create_gymnasium_app?",
        )
    return described
