"""The counter environment's ASGI app: `uvicorn server.app:app` from this folder.

Sessions over WebSocket at /ws; MCP clients at /mcp. `OPENENV_MAX_CONCURRENT_ENVS`
sets the session cap (default 256) and `OPENENV_SESSION_TIMEOUT` the idle
timeout in seconds (default: 300; `none` for never; MCP sessions then idle out
after 30 minutes).
"""

import os

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, create_app, serve

app = create_app(
    CounterEnvironment,
    CounterAction,
    CounterObservation,
    ConcurrencyConfig.from_env(max_concurrent_envs=256),
    mcp=True,
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
