"""The client's side of a vector session (``batched.py``): one session, all envs per call.

``RemoteVectorEnv`` uses it when the server's ``GET /gymnasium/spaces`` says
``vector``: a reset carries ``num_envs`` and the autoreset mode, a step the
list of every environment's action, and each reply the batch as arrays.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any, Literal

import gymnasium
import numpy as np
import orjson
from gymnasium.vector import AutoresetMode
from websockets.exceptions import ConnectionClosed

from openenv import protocol
from openenv.adapters.gymnasium.spaces import from_json
from openenv.client._base import error_from, ws_url
from openenv.client.blocking_ws import BlockingWebSocket
from openenv.client.sockets import CONNECT_FAILURES, connect_error
from openenv.errors import (
    EnvTimeoutError,
    SessionClosedError,
    server_error,
)

__all__ = [
    "UNREADABLE",
    "VectorLink",
    "decode_infos",
    "final_observations",
    "refuse_unreset",
    "seconds_until",
    "stack_lists",
]


class VectorLink:
    """One vector session of ``num_envs`` environments over one WebSocket (protocol v1)."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        timeout: float,
        num_envs: int,
        autoreset_mode: AutoresetMode,
        max_envs: int,
        busy_poll: float = 0.0,
        connect_timeout: float = 10.0,
    ) -> None:
        if num_envs > max_envs:
            raise ValueError(
                f"num_envs={num_envs}, but this server's vector sessions hold at most {max_envs}"
            )
        self.num_envs = num_envs
        self.autoreset_mode = autoreset_mode
        self.timeout = timeout
        self._ids = itertools.count()
        url = ws_url(base_url)
        try:
            # Driven in the caller's thread: a reply is parsed by the thread
            # waiting for it, with no hand-over from a reader thread.
            self._ws: BlockingWebSocket | None = BlockingWebSocket(
                url,
                headers=headers,
                open_timeout=connect_timeout,
                send_timeout=timeout,
                busy_poll=busy_poll,
            )
        except CONNECT_FAILURES as exc:
            raise connect_error(url, exc, connect_timeout) from None
        try:
            self._call("state", None)  # a server at capacity says so now, not at reset
        except BaseException:
            ws, self._ws = self._ws, None
            ws.close()
            raise

    def reset(self, seed: Any, options: dict[str, Any] | None) -> dict[str, Any]:
        """Reset (``seed``: an int, one per environment, or ``None``); the batch's fields."""
        data: dict[str, Any] = {
            "num_envs": self.num_envs,
            "autoreset_mode": self.autoreset_mode.value,
        }
        if isinstance(seed, int):
            data["seed"] = seed  # environment i gets seed + i, as in SyncVectorEnv
        elif seed is not None:
            data["seeds"] = list(seed)  # one each (reset's seed is one integer on the wire)
        if options:
            data["options"] = options
        return self._fields(self._call("reset", data))

    def step(self, actions: Any) -> dict[str, Any]:
        """Step every environment with its action; the batch's fields."""
        return self._fields(self._call("step", {"actions": np.asarray(actions).tolist()}))

    def close(self) -> None:
        """End the session (freeing its slot) and the connection."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            with contextlib.suppress(OSError, ConnectionClosed):
                ws.send(protocol.request_frame("close"))
        finally:
            ws.close()

    def _call(
        self, kind: Literal["reset", "step", "state"], data: dict[str, Any] | None
    ) -> dict[str, Any]:
        ws = self._ws
        if ws is None:
            raise SessionClosedError("this vector env is closed")
        request_id = next(self._ids)
        # One bound for the whole call, however many late replies come first.
        deadline = time.monotonic() + self.timeout
        try:
            # The server may have said why (at capacity) before closing: read on.
            with contextlib.suppress(ConnectionClosed):
                ws.send(protocol.request_frame(kind, data, request_id))
            while True:
                frame = ws.recv(timeout=seconds_until(deadline))
                try:
                    answer = _answer(frame, kind, request_id)
                except UNREADABLE as exc:
                    # As MuxClient: the connection can be trusted no further.
                    self._ws = None
                    ws.close()
                    raise SessionClosedError(f"the connection failed: {exc!r}") from None
                if answer is not None:
                    break
        except ConnectionClosed as exc:
            close = exc.rcvd or exc.sent
            why = close.reason or f"close code {close.code}" if close else "no close frame"
            raise SessionClosedError(f"the server closed the vector session ({why})") from None
        except TimeoutError:
            raise EnvTimeoutError(f"no reply to {kind!r} within {self.timeout}s") from None
        if isinstance(answer, Exception):
            raise answer
        return answer

    @staticmethod
    def _fields(data: dict[str, Any]) -> dict[str, Any]:
        fields: dict[str, Any] = data["observation"]
        return fields


# What reading a reply that is not the protocol raises (orjson's errors are ValueErrors).
UNREADABLE = (ValueError, LookupError, TypeError, AttributeError)
# What RemoteVectorEnv reads of the batch a reset or a step answers with.
_BATCH = {
    "reset": ("observations",),
    "step": ("observations", "rewards", "terminations", "truncations"),
    "state": (),
}


def _answer(frame: str | bytes, kind: str, request_id: int) -> dict[str, Any] | Exception | None:
    """The reply ``frame`` to the request ``request_id`` (a ``kind``): its data, or
    its error; ``None`` if it answers another. Raises one of ``UNREADABLE`` if the
    frame is not the protocol."""
    reply = orjson.loads(frame)
    # Another id: the late reply of a call given up on. An error with none
    # answers no request in particular (the server at capacity).
    reply_id = reply.get("id")
    if reply_id != request_id and not (reply_id is None and reply.get("type") == "error"):
        return None
    if reply["type"] == "error":
        return error_from(reply["data"])
    data: dict[str, Any] = reply["data"]
    if kind != "state":
        if reply["type"] != "observation":
            raise ValueError(f"a {reply['type']!r} in reply to {kind!r}")
        missing = [name for name in _BATCH[kind] if name not in data["observation"]]
        if missing:
            raise KeyError(f"a batch without {', '.join(missing)}")
    return data


def refuse_unreset(mode: AutoresetMode, ended: np.ndarray[Any, Any]) -> None:
    """Refuse a step, before any environment takes it, while ``DISABLED`` autoreset
    leaves environments whose episode ended unreset (``ended``). ``SyncVectorEnv``
    asserts midway, after stepping those before; here the others would step, their
    results lost with the call's error, and end their episodes a step early."""
    if mode is AutoresetMode.DISABLED and ended.any():
        envs = np.flatnonzero(ended).tolist()
        raise server_error(
            protocol.ErrorCode.EXECUTION_ERROR,
            f"the episodes of environments {envs} are over and autoreset_mode is DISABLED: "
            "reset them first (reset(), or reset(options={'reset_mask': mask})); "
            "no environment stepped",
            {"envs": envs},
        )


def seconds_until(deadline: float) -> float:
    """Seconds left until ``deadline`` (``time.monotonic()``); ``TimeoutError`` if none
    are: a frame already in would be handed out by ``recv`` however late."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def decode_infos(value: Any) -> Any:
    """A batched info dict from JSON: numbers and flags as arrays, anything else
    (texts; ``final_obs`` of environments that did not finish is ``None``) as object arrays.

    >>> infos = decode_infos({"_final_obs": [True, False], "final_obs": [[0.5, 1.0], None]})
    >>> infos["_final_obs"], infos["final_obs"][0], infos["final_obs"][1]
    (array([ True, False]), array([0.5, 1. ]), None)
    >>> decode_infos({"energy": [1.5, "-Infinity"], "names": ["NaN", "ok"]})
    {'energy': array([ 1.5, -inf]), 'names': array(['NaN', 'ok'], dtype=object)}
    >>> decode_infos({"dist": [[1.0, "Infinity"], [2.0, 3.0]]})["dist"]
    array([[ 1., inf],
           [ 2.,  3.]])
    """
    if isinstance(value, dict):
        return {key: decode_infos(item) for key, item in value.items()}
    if not isinstance(value, list):
        return value
    if (array := _numeric(value)) is not None:
        return array
    out = np.empty(len(value), dtype=object)
    for i, item in enumerate(value):
        out[i] = _decode_item(item)
    return out


def _numeric(value: list[Any]) -> np.ndarray[Any, Any] | None:
    """``value`` as the numeric array it came from, if it holds numbers and flags
    only, some floats perhaps written as JSON lacks them ("NaN", "Infinity",
    "-Infinity"); else ``None``: numpy would make [1, "a"] the strings ["1", "a"],
    and a batch of texts is an object array in ``SyncVectorEnv``, not "<U"."""
    try:
        array = np.asarray(value)
    except ValueError:  # ragged
        return None
    if array.dtype.kind in "biuf":
        return array
    if array.dtype.kind == "U" and _non_finite(value):
        return np.asarray(_floats(value), dtype=np.float64)
    return None


def _non_finite(value: Any) -> bool:
    """Whether every number nested in ``value`` is a number or one JSON lacks
    ("NaN", "Infinity", "-Infinity"), with no other text and no flag."""
    if isinstance(value, list):
        return all(_non_finite(item) for item in value)
    if isinstance(value, str):
        return value in ("NaN", "Infinity", "-Infinity")
    return isinstance(value, int | float) and not isinstance(value, bool)


def _floats(value: Any) -> Any:
    if isinstance(value, list):
        return [_floats(item) for item in value]
    return protocol.reward_from(value)


def _decode_item(item: Any) -> Any:
    """One environment's entry of a batch: numbers as an array, other lists as they came."""
    if not isinstance(item, list):
        return decode_infos(item)
    array = _numeric(item)
    return item if array is None else array


def final_observations(infos: dict[str, Any], space: gymnasium.Space[Any]) -> dict[str, Any]:
    """``infos`` with ``final_obs`` as ``SyncVectorEnv`` gives it: an object array of
    observations of ``space`` (``None`` where none ended), also when every
    environment's episode ended at once (JSON made one numeric array of them).

    >>> box = gymnasium.spaces.Box(-1.0, 1.0, (2,))
    >>> infos = final_observations({"_final_obs": [True], "final_obs": [[0.5, 1.0]]}, box)
    >>> infos["final_obs"].dtype, infos["final_obs"][0]
    (dtype('O'), array([0.5, 1. ], dtype=float32))
    """
    if "final_obs" not in infos:
        return infos
    ended = infos["final_obs"]
    batch = np.full(len(ended), None, dtype=object)
    for i in np.flatnonzero(infos["_final_obs"]):
        batch[i] = from_json(space, ended[i])
    return {**infos, "final_obs": batch}


def stack_lists(infos: dict[str, Any]) -> dict[str, Any]:
    """Batched infos of JSON infos, whose numpy arrays came as lists (Gymnasium's
    ``_add_info`` keeps lists in an object array): numbers of one shape in every
    environment as one array of them, as ``SyncVectorEnv`` batches an info's
    arrays (zeros where an environment has none). The dtype is JSON's
    (``int64``, ``float64``, ``bool``), not necessarily the environment's.

    >>> mask = np.empty(2, dtype=object)
    >>> mask[0] = [1, 0]
    >>> stack_lists({"action_mask": mask, "_action_mask": np.array([True, False])})["action_mask"]
    array([[1, 0],
           [0, 0]])
    """
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if isinstance(value, dict):
            out[key] = stack_lists(value)
        elif key != "final_obs" and f"_{key}" in infos:
            out[key] = _stacked(value, infos[f"_{key}"])
        else:
            out[key] = value
    return out


def _stacked(values: Any, present: Any) -> Any:
    if not isinstance(values, np.ndarray) or values.dtype != object:
        return values
    given = [values[i] for i in np.flatnonzero(present)]
    # Arrays (lists here) and numbers some of which are NaN or infinite (written
    # as text); a ragged or not numeric lot stays as Gymnasium keeps it.
    if not given or not all(isinstance(item, list | str | int | float) for item in given):
        return values
    stacked = _numeric(given)
    if stacked is None:
        return values
    batch = np.zeros((len(values), *stacked.shape[1:]), dtype=stacked.dtype)
    batch[np.asarray(present, dtype=np.bool_)] = stacked
    return batch
