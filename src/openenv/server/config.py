"""Server configuration: the session cap and the other knobs of ``create_app``."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ConcurrencyConfig", "ServerSettings"]


class ConcurrencyConfig(BaseModel):
    """How many sessions a server holds at once, and how long an idle one lives.

    >>> ConcurrencyConfig(max_concurrent_envs=64, session_timeout=300).max_concurrent_envs
    64
    >>> ConcurrencyConfig(max_concurrent_envs=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for ConcurrencyConfig
    max_concurrent_envs
      Input should be greater than or equal to 1 ...
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrent_envs: int = Field(
        default=1, ge=1, description="Sessions (environment instances) alive at once."
    )
    session_timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds a session may stay idle before it is closed; None = never.",
    )

    @classmethod
    def from_env(
        cls, max_concurrent_envs: int = 1, session_timeout: float | None = None
    ) -> ConcurrencyConfig:
        """Read ``OPENENV_MAX_CONCURRENT_ENVS`` / ``OPENENV_SESSION_TIMEOUT``, else the defaults.

        ``openenv serve --max-sessions`` and container deployments set these.
        """
        values: dict[str, Any] = {
            "max_concurrent_envs": max_concurrent_envs,
            "session_timeout": session_timeout,
        }
        if raw := os.environ.get("OPENENV_MAX_CONCURRENT_ENVS"):
            values["max_concurrent_envs"] = raw
        if raw := os.environ.get("OPENENV_SESSION_TIMEOUT"):
            values["session_timeout"] = None if raw.lower() in {"none", "0"} else raw
        return cls.model_validate(values)


class ServerSettings(BaseModel):
    """The keyword settings of ``create_app`` besides the session cap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_threads: int = Field(
        default=64,
        ge=1,
        description="Worker threads for plain `def` environment methods, shared by all sessions.",
    )
    reap_interval: float | None = Field(
        default=None,
        gt=0,
        description="Seconds between idle-session sweeps; default: a quarter of session_timeout.",
    )
    mcp: bool = Field(
        default=False,
        description="Also serve the tools to MCP clients at /mcp (needs the openenv[mcp] extra).",
    )
