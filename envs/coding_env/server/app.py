"""The coding environment's ASGI app: `uvicorn server.app:app` from this folder.

`OPENENV_MAX_CONCURRENT_ENVS` sets the session cap (default 256) and
`OPENENV_SESSION_TIMEOUT` the idle timeout in seconds; `CODING_ENV_<LIMIT>`
sets each of the sandbox's limits (`CODING_ENV_TIMEOUT=30`,
`CODING_ENV_MEMORY_BYTES=...`; see `SandboxLimits`).
"""

import functools
import os

from coding_env.models import CodeAction, CodeObservation
from coding_env.server.environment import CodingEnvironment
from coding_env.server.sandbox import SandboxLimits
from openenv import ConcurrencyConfig, create_app, serve

app = create_app(
    functools.partial(CodingEnvironment, limits=SandboxLimits.from_env()),
    CodeAction,
    CodeObservation,
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
