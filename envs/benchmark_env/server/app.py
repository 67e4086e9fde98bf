"""The benchmark environment's ASGI apps: `uvicorn server.app:app` from this folder.

`app` serves the plain `def step` (waits in `time.sleep`, off the event loop);
`async_app` the `async def step` (waits in `asyncio.sleep`, on the loop).
`OPENENV_MAX_CONCURRENT_ENVS` sets the session cap (default 1024) and
`OPENENV_SESSION_TIMEOUT` the idle timeout in seconds (default: 300; `none` for never).
"""

import os

from benchmark_env.models import BenchAction, BenchObservation
from benchmark_env.server.environment import AsyncBenchmarkEnvironment, BenchmarkEnvironment
from openenv import ConcurrencyConfig, create_app, serve

app = create_app(
    BenchmarkEnvironment,
    BenchAction,
    BenchObservation,
    ConcurrencyConfig.from_env(max_concurrent_envs=1024),
    # This process serves only this app: the collector may run less often
    # (plain uvicorn leaves CPython's defaults; `openenv serve` tunes it anyway).
    gc_threshold=20_000,
)
async_app = create_app(
    AsyncBenchmarkEnvironment,
    BenchAction,
    BenchObservation,
    ConcurrencyConfig.from_env(max_concurrent_envs=1024),
    # This process serves only this app: the collector may run less often
    # (plain uvicorn leaves CPython's defaults; `openenv serve` tunes it anyway).
    gc_threshold=20_000,
)


def main() -> None:
    """Serve `app` on $HOST:$PORT (default 0.0.0.0:8000); the `server` script."""
    # openenv's runner: its fast WebSocket protocol, and a graceful drain on SIGTERM.
    serve(app, host=os.environ.get("HOST", "0.0.0.0"), port=int(os.environ.get("PORT", "8000")))


if __name__ == "__main__":
    main()
