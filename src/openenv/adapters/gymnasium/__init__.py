"""Serve any Gymnasium environment over openenv sessions (``openenv-scale[gymnasium]``).

Action and observation models are derived from the environment's spaces, so
the JSON Schema at ``/schema`` says exactly what an action looks like:

>>> from openenv.adapters.gymnasium import create_gymnasium_app, gymnasium_models
>>> app = create_gymnasium_app("CartPole-v1")  # serve with: uvicorn module:app
>>> schema = gymnasium_models("CartPole-v1").action_cls.model_json_schema()
>>> {key: schema["properties"]["action"][key] for key in ("type", "minimum", "maximum")}
{'type': 'integer', 'minimum': 0, 'maximum': 1}
"""

try:
    import gymnasium as _gymnasium  # noqa: F401
except ImportError as exc:  # pragma: no cover - only without the extra
    if exc.name != "gymnasium":
        raise
    raise ImportError(
        "openenv.adapters.gymnasium needs Gymnasium: pip install 'openenv-scale[gymnasium]'"
    ) from exc

from openenv.adapters.gymnasium.batched import (
    GymnasiumVectorEnvironment,
    VectorAction,
    VectorObservation,
    create_gymnasium_vector_app,
)
from openenv.adapters.gymnasium.environment import (
    EnvSource,
    GymnasiumAction,
    GymnasiumEnvironment,
    GymnasiumModels,
    GymnasiumObservation,
    GymnasiumState,
    create_gymnasium_app,
    gymnasium_models,
)
from openenv.adapters.gymnasium.remote_env import RemoteGymnasiumEnv
from openenv.adapters.gymnasium.spaces import annotation, from_json, jsonable, to_json
from openenv.adapters.gymnasium.vector import RemoteVectorEnv

__all__ = [
    "EnvSource",
    "GymnasiumAction",
    "GymnasiumEnvironment",
    "GymnasiumModels",
    "GymnasiumObservation",
    "GymnasiumState",
    "GymnasiumVectorEnvironment",
    "RemoteGymnasiumEnv",
    "RemoteVectorEnv",
    "VectorAction",
    "VectorObservation",
    "annotation",
    "create_gymnasium_app",
    "create_gymnasium_vector_app",
    "from_json",
    "gymnasium_models",
    "jsonable",
    "to_json",
]
