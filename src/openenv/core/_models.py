"""OpenEnv 0.10's ``Action``, ``Observation`` and ``State``, as subclasses of openenv's.

OpenEnv's ``Action``, ``Observation`` and ``State`` validate assignments and
allow fields of any type (a ``numpy.ndarray``, a tensor); these do too, and are
openenv's models otherwise (an OpenEnv ``Action`` is an ``openenv.Action``).
A field pydantic cannot write as JSON is written as its ``tolist()`` (a NumPy
array reaches the client as nested lists).

>>> import numpy as np
>>> from openenv.protocol import observation_frame
>>> class Frame(Observation):
...     pixels: np.ndarray
>>> seen = Frame(pixels=np.zeros((1, 2), dtype=np.uint8))
>>> seen.done = "maybe"
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for Frame
...
>>> observation_frame(seen)
'{"type":"observation","data":{"observation":{"pixels":[[0,0]]},"reward":null,"done":false}}'
"""

from __future__ import annotations

from pydantic import ConfigDict

from openenv.types import Action as _Action
from openenv.types import Observation as _Observation
from openenv.types import State as _State

__all__ = ["Action", "Observation", "State"]

# What OpenEnv's models set; openenv's own settings (extra=, NaN as text) are kept.
_OPENENV_CONFIG = ConfigDict(validate_assignment=True, arbitrary_types_allowed=True)


class Action(_Action):
    """OpenEnv's ``Action``: ``openenv.Action`` with OpenEnv's model settings."""

    model_config = _OPENENV_CONFIG


class Observation(_Observation):
    """OpenEnv's ``Observation``: ``openenv.Observation`` with OpenEnv's model settings."""

    model_config = _OPENENV_CONFIG


class State(_State):
    """OpenEnv's ``State``: ``openenv.State`` with OpenEnv's model settings."""

    model_config = _OPENENV_CONFIG
