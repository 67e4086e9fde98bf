"""Which Gymnasium environment is served: `GYMNASIUM_ENV` (default CartPole-v1).

The adapter (`openenv.adapters.gymnasium.GymnasiumEnvironment`) does the work;
this module only picks the environment. To serve one that is not registered,
pass a factory instead of an id: `create_gymnasium_app(make_my_env)`.
"""

import os

from openenv.adapters.gymnasium import GymnasiumEnvironment

ENV_ID = os.environ.get("GYMNASIUM_ENV", "CartPole-v1")

__all__ = ["ENV_ID", "GymnasiumEnvironment"]
