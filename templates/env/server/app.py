"""__env_name__'s ASGI app: `openenv serve` or `uvicorn server.app:app` from this folder.

`OPENENV_MAX_CONCURRENT_ENVS` sets the session cap (default 64) and
`OPENENV_SESSION_TIMEOUT` the idle timeout in seconds (default: 300; `none` for never);
`openenv serve --max-sessions N --session-timeout S` sets both for you.
"""

import os

from openenv import ConcurrencyConfig, create_app, serve

from __env_name__.models import __Prefix__Action, __Prefix__Observation
from __env_name__.server.environment import __Prefix__Environment

# The class, not an instance: every session gets an environment of its own.
app = create_app(
    __Prefix__Environment,
    __Prefix__Action,
    __Prefix__Observation,
    ConcurrencyConfig.from_env(max_concurrent_envs=64),
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
