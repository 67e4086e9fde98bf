"""Every exception openenv raises, in one tree.

    OpenEnvError
    ├── ConcurrencyConfigurationError   the server would share unsafe environments
    ├── ConnectionFailedError           could not open a session (refused, timed out, bad URL)
    ├── SessionClosedError              the connection dropped or the session ended
    ├── EnvTimeoutError                 no reply within the client's message timeout
    ├── EngineError                     a runtime engine cannot be loaded or misbehaved
    └── ServerError                     the server answered with an ``error`` frame
        ├── ProtocolError               INVALID_JSON, UNKNOWN_TYPE
        ├── EnvValidationError          VALIDATION_ERROR
        ├── EnvExecutionError           EXECUTION_ERROR
        └── SessionError                the session cannot go on (SESSION_ERROR)
            ├── CapacityError           CAPACITY_REACHED: retry later
            └── FactoryError            FACTORY_ERROR

A ``ServerError`` carries the server's ``code``, ``message`` and ``details``.
"""

from __future__ import annotations

from typing import Any

from openenv.protocol import ErrorCode

__all__ = [
    "CapacityError",
    "ConcurrencyConfigurationError",
    "ConnectionFailedError",
    "EngineError",
    "EnvExecutionError",
    "EnvTimeoutError",
    "EnvValidationError",
    "FactoryError",
    "OpenEnvError",
    "ProtocolError",
    "ServerError",
    "SessionClosedError",
    "SessionError",
    "server_error",
]


class OpenEnvError(Exception):
    """Root of every openenv exception."""


class ConcurrencyConfigurationError(OpenEnvError):
    """``max_concurrent_envs > 1`` for an environment not declared safe for it."""


class ConnectionFailedError(OpenEnvError):
    """A session could not be opened: nothing listening, a timeout, or a bad URL."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot connect to {url}: {reason}")
        self.url = url
        self.reason = reason


class SessionClosedError(OpenEnvError):
    """The connection dropped or was closed; open a new client to go on."""

    def __init__(self, reason: str, *, close_code: int | None = None) -> None:
        text = f"session closed: {reason}"
        if close_code is not None:
            text += f" (close code {close_code})"
        super().__init__(text)
        self.reason = reason
        self.close_code = close_code


class EnvTimeoutError(OpenEnvError, TimeoutError):
    """The server did not reply within the client's ``message_timeout``."""


class EngineError(OpenEnvError):
    """A runtime engine is unknown, its extra is not installed, or it broke its contract."""


class ServerError(OpenEnvError):
    """The server answered a request with an ``error`` frame."""

    def __init__(self, code: ErrorCode, message: str, details: dict[str, Any] | None = None):
        super().__init__(f"[{code.value}] {message}")
        self.code = code
        self.message = message
        self.details = details or {}


class ProtocolError(ServerError):
    """The client sent a frame the server could not read (a client bug)."""


class EnvValidationError(ServerError):
    """The action or reset arguments do not fit the schema; see ``errors``."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        errors: list[dict[str, Any]] = self.details.get("errors", [])
        return errors


class EnvExecutionError(ServerError):
    """The environment raised while handling the request; the session goes on."""


class SessionError(ServerError):
    """The server ended the session; it cannot be used again."""


class CapacityError(SessionError):
    """Every session slot is taken; retry later."""

    @property
    def active_sessions(self) -> int | None:
        value = self.details.get("active_sessions")
        return value if isinstance(value, int) else None

    @property
    def max_sessions(self) -> int | None:
        value = self.details.get("max_sessions")
        return value if isinstance(value, int) else None


class FactoryError(SessionError):
    """The server could not create an environment for this session."""


_BY_CODE: dict[ErrorCode, type[ServerError]] = {
    ErrorCode.INVALID_JSON: ProtocolError,
    ErrorCode.UNKNOWN_TYPE: ProtocolError,
    ErrorCode.VALIDATION_ERROR: EnvValidationError,
    ErrorCode.EXECUTION_ERROR: EnvExecutionError,
    ErrorCode.CAPACITY_REACHED: CapacityError,
    ErrorCode.FACTORY_ERROR: FactoryError,
    ErrorCode.SESSION_ERROR: SessionError,
}


def server_error(code: ErrorCode, message: str, details: dict[str, Any]) -> ServerError:
    """Build the exception class that matches an error frame's code."""
    return _BY_CODE.get(code, ServerError)(code, message, details)
