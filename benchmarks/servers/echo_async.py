"""Our echo environment with an ``async def step``: served on the event loop, no thread hop."""

from typing import Any

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, create_app


class AsyncEchoEnvironment(EchoEnvironment):
    """The shipped echo environment, with ``reset`` and ``step`` as coroutines."""

    async def reset(  # type: ignore[override]
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> EchoObservation:
        return EchoEnvironment.reset(self, seed, episode_id, **kwargs)

    async def step(self, action: EchoAction, **kwargs: Any) -> EchoObservation:  # type: ignore[override]
        return EchoEnvironment.step(self, action, **kwargs)


app = create_app(
    AsyncEchoEnvironment,
    EchoAction,
    EchoObservation,
    ConcurrencyConfig.from_env(max_concurrent_envs=64),
    # This process serves only this app: the collector may run less often
    # (plain uvicorn leaves CPython's defaults; `openenv serve` tunes it anyway).
    gc_threshold=20_000,
)
