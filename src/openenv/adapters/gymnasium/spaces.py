"""Gymnasium spaces as pydantic types, and their values as JSON and back.

A space becomes a type whose JSON Schema says what a value looks like:
``Discrete(3)`` an integer from 0 to 2, ``Box(-2, 2, (1,))`` an array of one
number between -2 and 2, ``Dict`` an object, ``Tuple`` a fixed-length array.
For actions the bounds are enforced (a value out of range is a validation
error); for observations they are only documented, since environments do not
always keep to their own observation space.

>>> from gymnasium import spaces
>>> from pydantic import TypeAdapter
>>> schema = TypeAdapter(annotation(spaces.Box(-2.0, 2.0, (2,)), enforce=True)).json_schema()
>>> schema["items"], schema["minItems"], schema["maxItems"]
({'maximum': 2.0, 'minimum': -2.0, 'type': 'number'}, 2, 2)
>>> to_json(spaces.Discrete(4), from_json(spaces.Discrete(4), 3))
3
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
from gymnasium import spaces
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model
from pydantic.config import JsonDict

__all__ = [
    "action_annotation",
    "annotation",
    "describe",
    "from_json",
    "jsonable",
    "rebuild",
    "to_json",
]

# A Box with per-element bounds of up to this many elements gets one schema per element.
_MAX_PREFIX_ITEMS = 32
_HUGE = float(np.finfo(np.float32).max)
_SUPPORTED = "Discrete, Box, MultiDiscrete, MultiBinary, Dict and Tuple"


def annotation(space: spaces.Space[Any], *, enforce: bool, name: str = "Space") -> Any:
    """The pydantic type of the values of ``space`` in their JSON form.

    Args:
        space: A Gymnasium space, possibly nested (``Dict``, ``Tuple``).
        enforce: Validate the bounds (for actions) or only document them.
        name: Prefix of the names of models made for ``Dict`` spaces.

    Raises:
        TypeError: the space (or one nested in it) is of another kind.
    """
    if isinstance(space, spaces.Discrete):
        low = int(space.start)
        return Annotated[int, _bounds(low, low + int(space.n) - 1, enforce)]
    if isinstance(space, spaces.MultiBinary):
        zeros = np.zeros(space.shape, dtype=np.int64)
        return _array(int, zeros, zeros + 1, enforce)
    if isinstance(space, spaces.MultiDiscrete):
        start = np.asarray(space.start)
        return _array(int, start, start + np.asarray(space.nvec) - 1, enforce)
    if isinstance(space, spaces.Box):
        item = int if np.issubdtype(space.dtype, np.integer) else float
        return _array(item, space.low, space.high, enforce)
    if isinstance(space, spaces.Tuple):
        items = tuple(
            annotation(sub, enforce=enforce, name=f"{name}{i}") for i, sub in enumerate(space)
        )
        return tuple.__class_getitem__(items)
    if isinstance(space, spaces.Dict):
        fields: dict[str, Any] = {}
        for key, sub in space.spaces.items():
            field_name = _field_name(str(key), fields)
            nested = annotation(sub, enforce=enforce, name=f"{name}{_camel(str(key))}")
            fields[field_name] = (nested, Field(alias=str(key)))
        return create_model(
            name, __config__=ConfigDict(extra="forbid", populate_by_name=True), **fields
        )
    raise TypeError(
        f"cannot serve {space!r}: openenv.adapters.gymnasium supports {_SUPPORTED} spaces"
    )


def action_annotation(space: spaces.Space[Any], *, name: str = "Action") -> Any:
    """The pydantic type of an action of ``space``: ``annotation``'s, bounds enforced,
    and the value checked against the space itself. A server checks each action
    with it, and ``RemoteVectorEnv`` a batch before sending any of it.

    >>> from pydantic import TypeAdapter
    >>> TypeAdapter(action_annotation(spaces.Box(0.0, 1.0, (2,)))).validate_python([0.5, 1.0])
    [0.5, 1.0]
    """
    value = annotation(space, enforce=True, name=name)
    if isinstance(space, spaces.Discrete):
        # A Discrete's bounds in the schema are the whole space; others (a Box's
        # per-element bounds, a Dict's keys) are checked against the space too.
        return value
    return Annotated[value, AfterValidator(functools.partial(_check_action, space))]


def _check_action(space: spaces.Space[Any], value: Any) -> Any:
    if not space.contains(from_json(space, jsonable(value))):
        raise ValueError(f"{jsonable(value)!r} is not in the action space {space}")
    return value


def from_json(space: spaces.Space[Any], value: Any) -> Any:
    """A JSON value of ``space`` as the value Gymnasium expects (arrays, tuples, dicts).

    >>> from_json(spaces.Box(0.0, 1.0, (2,)), [0.5, 1.0])
    array([0.5, 1. ], dtype=float32)
    """
    if isinstance(space, spaces.Discrete):
        return np.int64(value)
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        return np.asarray(value, dtype=space.dtype).reshape(space.shape)
    if isinstance(space, spaces.Tuple):
        return tuple(from_json(sub, item) for sub, item in zip(space, value, strict=True))
    if isinstance(space, spaces.Dict):
        return {key: from_json(sub, value[key]) for key, sub in space.spaces.items()}
    raise TypeError(f"cannot convert values of {space!r}; supported: {_SUPPORTED}")


def to_json(space: spaces.Space[Any], value: Any) -> Any:
    """A value of ``space`` (numpy arrays and scalars included) as plain JSON values.

    >>> to_json(spaces.Box(0.0, 1.0, (2,)), np.array([0.5, 1.0], dtype=np.float32))
    [0.5, 1.0]
    """
    if isinstance(space, spaces.Discrete):
        return int(value)
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        return np.asarray(value).tolist()
    if isinstance(space, spaces.Tuple):
        return [to_json(sub, item) for sub, item in zip(space, value, strict=True)]
    if isinstance(space, spaces.Dict):
        return {key: to_json(sub, value[key]) for key, sub in space.spaces.items()}
    return jsonable(value)


def jsonable(value: Any) -> Any:
    """Anything from an ``info`` dict as plain JSON values; unknown objects as ``repr``.

    >>> jsonable({"x": np.float32(0.5), "seen": np.array([1, 2]), 3: (1, None)})
    {'x': 0.5, 'seen': [1, 2], '3': [1, None]}
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.ndarray | np.generic):
        listed = value.tolist()
        # An object array (a vector env's final_obs) lists its objects as they are.
        return jsonable(listed) if value.dtype == object else listed
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return repr(value)


def _array(item: type, low: Any, high: Any, enforce: bool) -> Any:
    low, high = np.asarray(low), np.asarray(high)
    if low.shape == ():
        return Annotated[item, _bounds(low.item(), high.item(), enforce)]
    # Elements are validated against the envelope of the bounds (exact when they
    # are uniform); actions are checked against the space itself as well.
    element: Any = Annotated[item, _bounds(low.min().item(), high.max().item(), enforce)]
    for size in reversed(low.shape[1:]):
        element = Annotated[list[element], Field(min_length=size, max_length=size)]
    size = low.shape[0]
    uniform = bool((low == low.flat[0]).all() and (high == high.flat[0]).all())
    if not uniform and low.size <= _MAX_PREFIX_ITEMS:
        # The schema gives each element its own bounds (JSON Schema's prefixItems,
        # per axis), so that a value drawn from it (RandomAgent's) is in the space.
        prefix = [_nested_schema(item, low[i], high[i]) for i in range(size)]
        per_item = functools.partial(_use_prefix_items, prefix)
        return Annotated[
            list[element], Field(min_length=size, max_length=size, json_schema_extra=per_item)
        ]
    return Annotated[list[element], Field(min_length=size, max_length=size)]


def _nested_schema(item: type, low: np.ndarray[Any, Any], high: np.ndarray[Any, Any]) -> JsonDict:
    if low.ndim == 0:
        return _item_schema(item, low.item(), high.item())
    size = low.shape[0]
    prefix: list[JsonDict] = [_nested_schema(item, low[i], high[i]) for i in range(size)]
    return {"type": "array", "prefixItems": list(prefix), "minItems": size, "maxItems": size}


def _item_schema(item: type, low: float, high: float) -> JsonDict:
    schema: JsonDict = {"type": "integer" if item is int else "number"}
    if abs(low) < _HUGE:
        schema["minimum"] = low
    if abs(high) < _HUGE:
        schema["maximum"] = high
    return schema


def _use_prefix_items(prefix: list[JsonDict], schema: JsonDict) -> None:
    schema.pop("items", None)
    schema["prefixItems"] = list(prefix)


def _bounds(low: float, high: float, enforce: bool) -> Any:
    # Infinite (or float32-max) bounds are no bounds, and JSON has no infinity.
    ge = low if abs(low) < _HUGE else None
    le = high if abs(high) < _HUGE else None
    if enforce:
        return Field(ge=ge, le=le)
    documented: JsonDict = {}
    if ge is not None:
        documented["minimum"] = ge
    if le is not None:
        documented["maximum"] = le
    return Field(json_schema_extra=documented)


def _field_name(key: str, taken: Mapping[str, Any]) -> str:
    name = re.sub(r"\W", "_", key)
    if not name or name[0].isdigit() or name.startswith("_"):
        name = f"f_{name}"
    while name in taken or name in BaseModel.__dict__:
        name += "_"
    return name


def _camel(key: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"\W|_", key) if part)


def describe(space: spaces.Space[Any]) -> dict[str, Any]:
    """A space as JSON, exact enough for ``rebuild`` to make it again (infinite bounds
    as the strings ``"inf"``/``"-inf"``, which JSON lacks).

    >>> describe(spaces.Box(-1.0, np.inf, (2,)))["high"]
    ['inf', 'inf']
    >>> space = spaces.Dict({"pos": spaces.Box(-1.0, np.inf, (2,)), "mode": spaces.Discrete(3)})
    >>> rebuild(describe(space)) == space
    True
    >>> full = spaces.Box(-np.inf, np.inf, (2,), dtype=np.int64)  # int64's whole range
    >>> rebuild(describe(full)) == full
    True
    """
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "low": _finite_or_text(space.low),
            "high": _finite_or_text(space.high),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": np.asarray(space.nvec).tolist(),
            "start": np.asarray(space.start).tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [describe(sub) for sub in space]}
    if isinstance(space, spaces.Dict):
        return {
            "type": "Dict",
            "spaces": {str(key): describe(sub) for key, sub in space.spaces.items()},
        }
    raise TypeError(f"cannot describe {space!r}; supported: {_SUPPORTED}")


def rebuild(description: Mapping[str, Any]) -> spaces.Space[Any]:
    """The space ``describe`` wrote."""
    kind = description["type"]
    if kind == "Discrete":
        return spaces.Discrete(description["n"], start=description["start"])
    if kind == "Box":
        dtype = np.dtype(description["dtype"])
        # Integer bounds are JSON integers; float ones may be "inf" text.
        read_as = dtype if np.issubdtype(dtype, np.integer) else np.float64
        low = np.asarray(description["low"], dtype=read_as).astype(dtype)
        high = np.asarray(description["high"], dtype=read_as).astype(dtype)
        return spaces.Box(low, high, tuple(description["shape"]), dtype=dtype)
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(
            description["nvec"], dtype=description["dtype"], start=description["start"]
        )
    if kind == "MultiBinary":
        return spaces.MultiBinary(description["n"])
    if kind == "Tuple":
        return spaces.Tuple([rebuild(sub) for sub in description["spaces"]])
    if kind == "Dict":
        return spaces.Dict({key: rebuild(sub) for key, sub in description["spaces"].items()})
    raise TypeError(f"unknown space type {kind!r}; supported: {_SUPPORTED}")


def _finite_or_text(values: np.ndarray[Any, Any]) -> Any:
    if np.issubdtype(values.dtype, np.integer):
        # Exact: through float64, int64's largest (a Box made with infinite
        # bounds has it) would come back as its smallest.
        return values.tolist()
    as_float = np.asarray(values, dtype=np.float64)
    if np.isfinite(as_float).all():
        return as_float.tolist()
    return np.where(np.isfinite(as_float), as_float, as_float.astype(str)).tolist()
