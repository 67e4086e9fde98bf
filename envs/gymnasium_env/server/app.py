"""The Gymnasium environment's ASGI app: `uvicorn server.app:app` from this folder.

`GYMNASIUM_ENV` picks the environment (default CartPole-v1; any id that
`gymnasium.make` knows), `GYMNASIUM_RENDER_MODE=rgb_array` adds each step's
frame to the observation (shown at /web), `OPENENV_MAX_CONCURRENT_ENVS` the session cap
(default 256) and `OPENENV_SESSION_TIMEOUT` the idle timeout in seconds.

`GYMNASIUM_VECTOR=1` serves vector sessions instead: each session steps as
many copies as its `RemoteVectorEnv` asks for, in one call (fastest for
many environments on one server; see the README).
"""

import os

from gymnasium_env.server.environment import ENV_ID, RENDER_MODE
from openenv import ConcurrencyConfig, serve
from openenv.adapters.gymnasium import create_gymnasium_app, create_gymnasium_vector_app

if os.environ.get("GYMNASIUM_VECTOR") == "1":
    app = create_gymnasium_vector_app(
        ENV_ID, ConcurrencyConfig.from_env(max_concurrent_envs=256), gc_threshold=20_000
    )
else:
    app = create_gymnasium_app(
        ENV_ID,
        ConcurrencyConfig.from_env(max_concurrent_envs=256),
        make_kwargs={"render_mode": RENDER_MODE} if RENDER_MODE else None,
        # This process serves only this app: the collector may run less often
        # (plain uvicorn leaves CPython's defaults; `openenv serve` tunes it anyway).
        gc_threshold=20_000,
    )


def main() -> None:
    """Serve on $HOST:$PORT (default 0.0.0.0:8000); the `server` script."""
    # openenv's runner: its fast WebSocket protocol, and a graceful drain on SIGTERM.
    serve(app, host=os.environ.get("HOST", "0.0.0.0"), port=int(os.environ.get("PORT", "8000")))


if __name__ == "__main__":
    main()
