"""Which Gymnasium environment is served: `GYMNASIUM_ENV` (default CartPole-v1).

`GYMNASIUM_RENDER_MODE=rgb_array` makes it render: every observation then
carries its frame as a PNG data URL (`frame`), which `/web` shows as an image.
Rendering costs more than a CartPole step, so it is off unless asked for.

The adapter (`openenv.adapters.gymnasium.GymnasiumEnvironment`) does the work;
this module only picks the environment. To serve one that is not registered,
pass a factory instead of an id: `create_gymnasium_app(make_my_env)`.
"""

import os

from openenv.adapters.gymnasium import GymnasiumEnvironment

ENV_ID = os.environ.get("GYMNASIUM_ENV", "CartPole-v1")
RENDER_MODE = os.environ.get("GYMNASIUM_RENDER_MODE") or None

__all__ = ["ENV_ID", "RENDER_MODE", "GymnasiumEnvironment"]
