"""Server configuration: the session cap and the other knobs of ``create_app``."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from openenv.trajectories import RecordFolder

__all__ = ["ConcurrencyConfig", "ServerSettings"]

# Idle seconds before a session is closed, unless the app says otherwise.
DEFAULT_SESSION_TIMEOUT = 300.0


class ConcurrencyConfig(BaseModel):
    """How many sessions a server holds at once, and how long an idle one lives.

    >>> ConcurrencyConfig(max_concurrent_envs=64, session_timeout=600).max_concurrent_envs
    64
    >>> ConcurrencyConfig().session_timeout  # idle sessions end after 5 minutes by default
    300.0
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
        default=DEFAULT_SESSION_TIMEOUT,
        gt=0,
        description=(
            "Seconds a session may stay idle before it is closed (default 5 minutes, so "
            "clients that walk away cannot hold every slot); None = never."
        ),
    )
    queue_timeout: float = Field(
        default=0,
        ge=0,
        description=(
            "Seconds a new connection waits for a free slot when the server is full, "
            "first come first served; 0 refuses at once with CAPACITY_REACHED."
        ),
    )

    @classmethod
    def from_env(
        cls, max_concurrent_envs: int = 1, session_timeout: float | None = DEFAULT_SESSION_TIMEOUT
    ) -> ConcurrencyConfig:
        """Read ``OPENENV_MAX_CONCURRENT_ENVS``, ``_SESSION_TIMEOUT``, ``_QUEUE_TIMEOUT``.

        ``openenv serve --max-sessions`` and container deployments set these.
        """
        values: dict[str, Any] = {
            "max_concurrent_envs": max_concurrent_envs,
            "session_timeout": session_timeout,
        }
        read = set()  # the fields a variable set
        for field, (var, _) in _ENV_VARS.items():
            if raw := os.environ.get(var):
                values[field] = raw
                read.add(field)
        if "session_timeout" in read and values["session_timeout"].lower() in {"none", "0"}:
            values["session_timeout"] = None
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            # pydantic names the field, which the user never wrote: name the variable.
            for error in exc.errors():
                if (field := str(error["loc"][0])) in read:
                    var, meaning = _ENV_VARS[field]
                    raise ValueError(f"{var} must be {meaning}, not {values[field]!r}") from None
            raise


# The variables ``ConcurrencyConfig.from_env`` reads, and what each must hold.
_ENV_VARS = {
    "max_concurrent_envs": ("OPENENV_MAX_CONCURRENT_ENVS", "a whole number of sessions, 1 or more"),
    "session_timeout": ("OPENENV_SESSION_TIMEOUT", "a positive number of seconds, or 'none'"),
    "queue_timeout": ("OPENENV_QUEUE_TIMEOUT", "a number of seconds, 0 or more"),
}


class ServerSettings(BaseModel):
    """The keyword settings of ``create_app`` besides the session cap.

    Deadlines are in seconds; ``None`` means no deadline.

    >>> ServerSettings(step_timeout=30).max_message_size
    1048576
    """

    # An error names the setting, not the value given: it may be the API key.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    max_threads: int = Field(
        default=64,
        ge=1,
        description=(
            "Worker threads for plain `def` environment methods, per lane (quick calls, "
            "slow calls), shared by all sessions."
        ),
    )
    reap_interval: float | None = Field(
        default=None,
        gt=0,
        description="Seconds between idle-session sweeps; default: a quarter of session_timeout.",
    )
    step_timeout: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Deadline of one step(). An async step is cancelled (TIMEOUT, the session goes "
            "on); a blocking step cannot be killed, so its session ends (TIMEOUT, fatal) and "
            "its slot stays taken until the thread returns."
        ),
    )
    reset_timeout: float | None = Field(
        default=None, gt=0, description="Deadline of one reset(); the same rules as step."
    )
    factory_timeout: float | None = Field(
        default=60.0, gt=0, description="Deadline for creating an environment."
    )
    close_timeout: float | None = Field(
        default=10.0,
        gt=0,
        description="Deadline of close(); past it the failure is logged and the slot freed.",
    )
    gc_threshold: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Tune the process's garbage collector while the app serves: allocations "
            "between young collections (CPython's default is 700), and startup objects "
            "frozen out of collections. None (the default) leaves the collector alone; "
            "openenv serve tunes it itself (20,000), since it owns the process."
        ),
    )
    max_message_size: int = Field(
        default=2**20,
        ge=1,
        description=(
            "Largest client frame in bytes; larger ones get close code 1009. Also the"
            " largest HTTP request body (/mcp, OpenReward's routes): larger ones get 413."
        ),
    )
    max_bad_frames: int = Field(
        default=20,
        ge=1,
        description=(
            "Consecutive malformed or invalid frames after which a session is closed (1008);"
            " tool calls with bad arguments (a model's mistakes) do not count."
        ),
    )
    max_requests_in_flight: int = Field(
        default=4096,
        ge=1,
        description=(
            "On one v2 (multiplexed) connection: requests read whose replies have "
            "not gone out yet (unanswered, or waiting for the socket). "
            "A frame carrying more is refused; past it the server reads no further "
            "frame until replies free room, so a client cannot queue without bound."
        ),
    )
    api_key: str | None = Field(
        default_factory=lambda: os.environ.get("OPENENV_API_KEY") or None,
        description="When set, every route but /health requires it (Bearer token).",
        repr=False,
        validate_default=True,  # $OPENENV_API_KEY is checked too
    )
    allowed_origins: tuple[str, ...] = Field(
        default_factory=lambda: _env_list("OPENENV_ALLOWED_ORIGINS"),
        description=(
            "Origins (scheme://host[:port]) whose pages may open sessions (WebSockets, "
            "/mcp), besides the server's own; '*' allows any. Requests without an Origin "
            "(programs) pass. Default: OPENENV_ALLOWED_ORIGINS, comma-separated."
        ),
    )
    allowed_hosts: tuple[str, ...] = Field(
        default_factory=lambda: _env_list("OPENENV_ALLOWED_HOSTS"),
        description=(
            "Host names the server answers to besides localhost names and IP literals "
            "(which always pass): exact names, '*.example.com' for subdomains, or '*' for "
            "any. Any other Host header gets 403, which stops DNS rebinding. Default: "
            "OPENENV_ALLOWED_HOSTS, comma-separated."
        ),
    )
    error_details: bool = Field(
        default=False,
        description=(
            "Send clients the full text of any exception an environment raises. Off, "
            "clients get the exception's type and only EnvError messages verbatim; the "
            "full text and traceback are always in the server log."
        ),
    )
    record: RecordFolder | None = Field(
        default_factory=lambda: os.environ.get("OPENENV_RECORD") or None,
        validate_default=True,  # OPENENV_RECORD is checked too
        description=(
            "A folder (a str or a Path) to record every session's requests and replies "
            "into, as JSON Lines (one file per server process); openenv.trajectories reads them. "
            "Default: OPENENV_RECORD, else off."
        ),
    )
    isolation: Literal["none", "process"] = Field(
        default="none",
        description=(
            "'process' makes each session's environment in a child process of its own: "
            "one that segfaults or exits ends only its session (a few ms and a process "
            "per session). Not for environments with @tool methods."
        ),
    )
    shutdown_timeout: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds a graceful shutdown waits for sessions to end and environments to "
            "close; past it the remaining connections are aborted and the server exits."
        ),
    )
    send_timeout: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds a client may leave a reply unread (its socket not draining) before "
            "its connection is aborted and its slot freed."
        ),
    )
    mcp: bool = Field(
        default=False,
        description=(
            "Also serve the tools to MCP clients at /mcp (needs openenv-scale[mcp]). "
            "Without an api_key, only for trusted networks."
        ),
    )
    mcp_open_timeout: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds an MCP session may wait for its first tool call (an OpenEnv /mcp "
            "session, for any request) before its environment is closed and its slot "
            "freed (later, session_timeout applies)."
        ),
    )
    mcp_sessions_per_client: int | None = Field(
        default=None,
        ge=1,
        description=(
            "MCP sessions (OpenEnv's /mcp sessions too) one client address may hold at "
            "once; default: half the session cap (at least 1), so no single address can "
            "take every slot."
        ),
    )

    @field_validator("record")
    @classmethod
    def _a_folder(cls, record: str | None) -> str | None:
        # Found at the first session instead, it stopped the server's start with
        # a raw FileExistsError from inside its lifespan.
        if record is not None and os.path.exists(record) and not os.path.isdir(record):
            given = "$OPENENV_RECORD=" if _from_var("OPENENV_RECORD", record) else ""
            raise ValueError(f"{given}{record} is a file; record sessions into a folder")
        return record

    @field_validator("api_key")
    @classmethod
    def _sendable_key(cls, key: str | None) -> str | None:
        # Clients send it in a header (or a WebSocket subprotocol), which carry
        # ASCII, and the server strips what surrounds a header's value: any
        # other key could never be sent so that it matches.
        if key is not None and not (key.isascii() and key.isprintable() and key == key.strip()):
            given = "$OPENENV_API_KEY" if _from_var("OPENENV_API_KEY", key) else "the API key"
            raise ValueError(  # never the key itself: a secret
                f"{given} must be printable ASCII with no spaces around it "
                f"(clients send it in an HTTP header)"
            )
        return key


def _from_var(var: str, value: str) -> bool:
    """Whether ``value`` is what ``$VAR`` holds: an error then names the variable,
    which a deployment sets, not only the field, which it never wrote."""
    return os.environ.get(var) == value


def _env_list(name: str) -> tuple[str, ...]:
    """A comma-separated environment variable as a tuple of its non-empty items."""
    return tuple(item.strip() for item in os.environ.get(name, "").split(",") if item.strip())
