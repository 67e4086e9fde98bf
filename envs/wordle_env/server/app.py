"""The Wordle environment's ASGI app: `uvicorn server.app:app` from this folder.

`OPENENV_MAX_CONCURRENT_ENVS` sets the session cap (default 256) and
`OPENENV_SESSION_TIMEOUT` the idle timeout in seconds.
"""

import os

from openenv import ConcurrencyConfig, create_app, serve
from wordle_env.models import WordleAction, WordleObservation
from wordle_env.server.environment import WordleEnvironment

app = create_app(
    WordleEnvironment,
    WordleAction,
    WordleObservation,
    ConcurrencyConfig.from_env(max_concurrent_envs=256),
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
