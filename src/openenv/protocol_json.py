"""How a frame is written as JSON, and the floats JSON lacks.

JSON has no number for NaN or infinity, and orjson writes ``null`` for them.
Frames carry them as the text ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``,
as pydantic's ``ser_json_inf_nan="strings"`` writes them: ``float()``, a
pydantic ``float`` field, NumPy given a float dtype and JavaScript's
``Number()`` all read them back, where a ``null`` would fail a typed client's
validation, and a trainer would take a NaN reward for no reward at all.

``openenv.protocol`` re-exports everything here.

>>> class Seen(Observation):
...     score: float
>>> observation_frame(Seen(score=float("-inf"), reward=float("nan")), 7)
'{"type":"observation","data":{"observation":{"score":"-Infinity"},"reward":"NaN","done":false},"id":7}'
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import orjson
import pydantic_core

from openenv.protocol_errors import RequestId
from openenv.types import Observation

__all__ = [
    "frame_text",
    "json_values",
    "observation_frame",
    "observation_reply",
    "observation_serializer",
    "reward_from",
    "reward_value",
]


def frame_text(value: Any) -> str:
    """``value`` as a frame's JSON text, NaN and ±inf as text (see above).

    >>> frame_text({"seen": [1.5, float("nan")], "left": None})
    '{"seen":[1.5,"NaN"],"left":null}'
    >>> import numpy as np
    >>> frame_text({"box": np.array([0.5, np.inf], dtype=np.float32), "left": None})
    '{"box":[0.5,"Infinity"],"left":null}'
    """
    text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    # orjson is the fast writer, and writes NaN and ±inf as null: a text with a
    # null that is not an observation's empty reward is written again, by
    # pydantic's writer. Looked for by the null's "u" first, which memchr finds
    # many times faster than a search for the word (most frames have none).
    if b"u" in text and _other_null(text, value):
        # What only orjson writes keeps its nulls.
        with contextlib.suppress(ValueError, TypeError):  # pydantic's error is a ValueError
            text = pydantic_core.to_json(value, inf_nan_mode="strings", fallback=_plain)
    return text.decode()


def json_values(value: Any) -> Any:
    """``value`` made of plain JSON values: pydantic models, sets, tuples and
    NumPy values inside lists and dicts too. ``TypeError`` for what has no JSON form.

    >>> from pydantic import BaseModel
    >>> class Point(BaseModel):
    ...     x: int
    >>> json_values({"points": [Point(x=1)], "seen": {2}})
    {'points': [{'x': 1}], 'seen': [2]}
    >>> json_values([object()])
    Traceback (most recent call last):
    ...
    TypeError: object is not JSON
    """
    try:
        return pydantic_core.to_jsonable_python(value, fallback=_plain)
    except pydantic_core.PydanticSerializationError as exc:  # e.g. bytes that are no UTF-8
        raise TypeError(str(exc)) from None


# How an observation reply without a reward is written (observation_reply's order).
_NO_REWARD = b'"reward":null,"done":'


def _other_null(text: bytes, value: Any) -> bool:
    """Whether ``text`` (``value`` written by orjson) holds a ``null`` but the empty
    rewards of ``value``'s observation replies (a NaN's, maybe)."""
    alike = 0  # nulls written as an empty reward is: a reply's, or a nested dict's
    at = text.find(b"null")
    while at >= 0:
        if at < 9 or not text.startswith(_NO_REWARD, at - 9):
            return True
        alike += 1
        at = text.find(b"null", at + 4)
    return alike > 0 and alike != _empty_rewards(value)


def _empty_rewards(value: Any) -> int:
    """How many observation replies without a reward ``value`` is (a reply) or holds
    (a v2 frame's list of them)."""
    if value.__class__ is list:
        return sum(map(_empty_reward, value))
    return _empty_reward(value)


def _empty_reward(reply: Any) -> int:
    if reply.__class__ is not dict or reply.get("type") != "observation":
        return 0
    data = reply.get("data")
    return data.__class__ is dict and "reward" in data and data["reward"] is None


def _plain(value: Any) -> Any:
    """What pydantic's writer leaves to its caller, as Python values it writes:
    NumPy arrays and scalars (orjson writes them itself)."""
    tolist = getattr(value, "tolist", None)
    if tolist is None:
        raise TypeError(f"{type(value).__name__} is not JSON")
    return tolist()


def reward_value(reward: Any) -> Any:
    """``reward`` as a frame carries it: a NaN or infinite float as the text
    ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, which JSON lacks numbers for.

    >>> reward_value(0.5), reward_value(float("nan")), reward_value(float("-inf"))
    (0.5, 'NaN', '-Infinity')
    >>> float(reward_value(float("inf")))
    inf
    """
    if reward.__class__ is float and reward - reward:  # only NaN and ±inf are not 0
        return "NaN" if reward != reward else "Infinity" if reward > 0 else "-Infinity"
    return reward


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def reward_from(value: Any) -> Any:
    """A reward as ``reward_value`` wrote it, back to its float; anything else as it is.

    >>> reward_from("-Infinity"), reward_from(1.5), reward_from(None)
    (-inf, 1.5, None)
    """
    return _NON_FINITE.get(value, value) if isinstance(value, str) else value


def observation_serializer(cls: type[Observation]) -> tuple[Callable[..., Any], str]:
    """What ``observation_reply`` dumps an observation of class ``cls`` with,
    ``to_python(observation, mode=mode)``, for a caller that dumps many of one
    class: looked up once, as two reads through pydantic's attribute hooks cost
    about a sixth of the dump.

    >>> class Seen(Observation):
    ...     text: str
    >>> to_python, mode = observation_serializer(Seen)
    >>> to_python(Seen(text="hi"), mode=mode)
    {'reward': None, 'done': False, 'metadata': {}, 'text': 'hi'}
    """
    return cls.__pydantic_serializer__.to_python, cls.dump_mode


def observation_frame(observation: Observation, request_id: RequestId | None = None) -> str:
    """Encode an observation reply; reward and done travel beside the fields."""
    return frame_text(observation_reply(observation, request_id))


def observation_reply(
    observation: Observation,
    request_id: RequestId | None = None,
    into: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``observation_frame`` before encoding: the reply's fields, added to ``into``
    (a v2 reply's ``session``), for a caller that encodes many replies at once
    (with ``frame_text``). ``fields``: the observation already dumped as here
    (``observation_serializer``), by a caller that dumps many of one class; it
    becomes the reply's ``observation``.

    >>> class Seen(Observation):
    ...     text: str
    >>> reply = observation_reply(Seen(text="hi", reward=1.0), 7, {"session": 2})
    >>> reply["session"], reply["type"], reply["id"]
    (2, 'observation', 7)
    >>> reply["data"]
    {'observation': {'text': 'hi'}, 'reward': 1.0, 'done': False}
    """
    # The model's prebuilt serializer, without an ``exclude`` set to resolve on
    # every call; the envelope's fields are then moved out of the dump (read from
    # it, not the model: a pydantic attribute read passes through the model's
    # __getattr__ hook, several times dearer than a dict's).
    if fields is None:
        serializer, mode = observation.__pydantic_serializer__, observation.dump_mode
        try:
            fields = serializer.to_python(observation, mode=mode)
        except pydantic_core.PydanticSerializationError:
            if mode != "json":
                raise
            # A field pydantic cannot write in JSON mode (a NumPy array of an
            # OpenEnv observation, whose models allow any type): its tolist().
            fields = serializer.to_python(observation, mode=mode, fallback=_plain)
    reward = fields.pop("reward")
    payload: dict[str, Any] = {
        "observation": fields,
        "reward": reward_value(reward) if reward.__class__ is float and reward - reward else reward,
        "done": fields.pop("done"),
    }
    # Beside the fields, and among them too (as OpenEnv's server sends it: its
    # clients read it there), but only when there is some.
    if metadata := fields["metadata"]:
        payload["metadata"] = metadata
    else:
        del fields["metadata"]
    reply = {} if into is None else into
    reply["type"] = "observation"
    reply["data"] = payload
    if request_id is not None:
        reply["id"] = request_id
    return reply
