"""The echo environment's ASGI app: `uvicorn server.app:app` from this folder.

`OPENENV_MAX_CONCURRENT_ENVS` sets the session cap (default 64) and
`OPENENV_SESSION_TIMEOUT` the idle timeout in seconds (default: 300; `none` for never).
"""

import os

from openenv import ConcurrencyConfig, create_app, serve

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment

app = create_app(
    EchoEnvironment,
    EchoAction,
    EchoObservation,
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
