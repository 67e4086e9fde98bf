"""Every exception openenv raises, in one tree.

    OpenEnvError
    ├── EnvError                        raised by an environment: its message reaches clients
    ├── ConcurrencyConfigurationError   the server would share unsafe environments
    ├── ConnectionFailedError           could not open a session (refused, timed out, bad URL)
    │   └── AuthenticationError         the server refused the API key or the Origin
    ├── SessionClosedError              the connection dropped or the session ended
    ├── EnvTimeoutError                 no reply within the client's message timeout
    ├── RequestFailedError              an HTTP request (``/tasks``, ``/envs``, ...) failed
    │   └── NotFoundError               404: no such split or environment
    ├── EngineError                     a runtime engine cannot be loaded or misbehaved
    │   └── WorkerLost                  a worker died holding a task (runtime.dispatch)
    ├── ServerError                     the server answered with an ``error`` frame
        ├── ProtocolError               INVALID_JSON, UNKNOWN_TYPE
        ├── EnvValidationError          VALIDATION_ERROR
        ├── EnvExecutionError           EXECUTION_ERROR
        ├── DeadlineError               TIMEOUT: the environment overran the server's deadline
        ├── UnknownToolError            UNKNOWN_TOOL
        ├── EpisodeFinishedError        EPISODE_FINISHED: reset to play again
        └── SessionError                the session cannot go on (SESSION_ERROR)
            ├── CapacityError           CAPACITY_REACHED: retry later
            └── FactoryError            FACTORY_ERROR
    └── ServerSideError                 inside a server only: becomes an error frame or a close
        ├── FrameError                  a client frame it cannot act on (openenv.protocol)
        ├── EnvFailure                  the environment failed a call (server.sessions)
        ├── SessionRefused              no session could be opened (server.service)
        ├── FactoryTimeout              the factory overran its deadline (server.service)
        ├── DeadlineExceeded            a call overran its deadline (server.calls)
        ├── NotStarted                  a call's ticket closed before it ran (server.handoff)
        └── EnvProcessDied              an isolated environment's process ended (server.isolation)

A ``ServerError`` carries the server's ``code``, ``message`` and ``details``.

Two classes also have the built-in base OpenEnv 0.10's client raises in their
place, so code written against it (``except RuntimeError``, ``except
ConnectionError``) catches them unchanged: ``ServerError`` is a
``RuntimeError`` and ``ConnectionFailedError`` a ``ConnectionError``.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Only for annotations: the protocol's server-side errors are in this tree,
    # so the protocol module imports this one.
    from openenv.protocol import ErrorCode

__all__ = [
    "AuthenticationError",
    "CapacityError",
    "ConcurrencyConfigurationError",
    "ConnectionFailedError",
    "DeadlineError",
    "EngineError",
    "EnvError",
    "EnvExecutionError",
    "EnvTimeoutError",
    "EnvValidationError",
    "EpisodeFinishedError",
    "FactoryError",
    "NotFoundError",
    "OpenEnvError",
    "ProtocolError",
    "RequestFailedError",
    "ServerError",
    "ServerSideError",
    "SessionClosedError",
    "SessionError",
    "UnknownToolError",
    "server_error",
    "shown_url",
]


class OpenEnvError(Exception):
    """Root of every openenv exception."""


_KEY_IN_QUERY = re.compile(r"([?&]api_key=)[^&#\s'\"]*", re.IGNORECASE)
_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^/@:?#]*:)[^/@?#]*@", re.IGNORECASE)


def shown_url(url: str) -> str:
    """``url`` fit for a message or a log: a key in its query (``?api_key=``, which
    browsers send) and a password in it replaced by ``***``.

    Errors travel into logs, tracebacks and ``TaskResult.error`` (results files).

    >>> shown_url("ws://h:8000/ws?api_key=s3cret&x=1")
    'ws://h:8000/ws?api_key=***&x=1'
    >>> shown_url("http://me:pw@h/")
    'http://me:***@h/'
    """
    return _PASSWORD.sub(r"\1***@", _KEY_IN_QUERY.sub(r"\1***", url))


class EnvError(OpenEnvError):
    """Raise it from an environment for a failure whose message clients may read.

    A server sends clients only the type of any other exception an environment
    raises (``step() raised KeyError``): exception text often carries paths,
    queries or credentials. An ``EnvError``'s message goes out as is, so say
    what the client did wrong and how to go on. Subclass it (also with a
    built-in, ``class BadMove(EnvError, ValueError)``) for your own kinds.
    The client gets an ``EnvExecutionError``; the session goes on.

    >>> from openenv import EnvError
    >>> try:
    ...     raise EnvError("the game is over; reset() to play another")
    ... except EnvError as exc:
    ...     str(exc)
    'the game is over; reset() to play another'
    """


class ConcurrencyConfigurationError(OpenEnvError):
    """``max_concurrent_envs > 1`` for an environment not declared safe for it."""


class ConnectionFailedError(OpenEnvError, ConnectionError):
    """A session could not be opened: nothing listening, a timeout, or a bad URL."""

    def __init__(self, url: str, reason: str) -> None:
        url = shown_url(url)
        super().__init__(f"cannot connect to {url}: {reason}")
        self.url = url
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle their args (the message), not this constructor's:
        # without this they could not cross to another process (a Ray or Spark
        # worker's result, a process pool's) at all.
        return (type(self), (self.url, self.reason), self.__dict__)


class AuthenticationError(ConnectionFailedError):
    """The server refused the handshake: a missing or wrong API key, or a foreign Origin."""


class SessionClosedError(OpenEnvError):
    """The connection dropped or was closed; open a new client to go on."""

    def __init__(self, reason: str, *, close_code: int | None = None) -> None:
        text = f"session closed: {reason}"
        if close_code is not None:
            text += f" (close code {close_code})"
        super().__init__(text)
        self.reason = reason
        self.close_code = close_code

    def __reduce__(self) -> tuple[Any, ...]:
        rebuild = functools.partial(type(self), close_code=self.close_code)
        return (rebuild, (self.reason,), self.__dict__)


class EnvTimeoutError(OpenEnvError, TimeoutError):
    """The server did not reply within the client's ``message_timeout``."""


class RequestFailedError(OpenEnvError):
    """An HTTP introspection request failed; ``detail`` is the server's explanation."""

    def __init__(self, url: str, status_code: int, detail: str) -> None:
        url = shown_url(url)
        super().__init__(f"GET {url} failed ({status_code}): {detail}")
        self.url = url
        self.status_code = status_code
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.url, self.status_code, self.detail), self.__dict__)


class NotFoundError(RequestFailedError, LookupError):
    """No such split or environment on the server; ``detail`` lists the real ones."""


class EngineError(OpenEnvError):
    """A runtime engine is unknown, its extra is not installed, or it broke its contract."""


class ServerError(OpenEnvError, RuntimeError):
    """The server answered a request with an ``error`` frame."""

    def __init__(self, code: ErrorCode, message: str, details: dict[str, Any] | None = None):
        super().__init__(f"[{code.value}] {message}")
        self.code = code
        self.message = message
        self.details = details or {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.code, self.message, self.details), self.__dict__)


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


class DeadlineError(ServerError, TimeoutError):
    """The environment overran the server's ``step_timeout``/``reset_timeout``.

    ``fatal`` is true when the call was blocking and the session was ended.
    """

    @property
    def fatal(self) -> bool:
        return bool(self.details.get("fatal", False))


class UnknownToolError(ServerError):
    """The environment has no tool by that name; ``tools`` lists the ones it has."""

    @property
    def tools(self) -> list[str]:
        tools: list[str] = self.details.get("tools", [])
        return tools


class EpisodeFinishedError(ServerError):
    """A tool ended the episode; call ``reset`` before calling tools again."""


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


class ServerSideError(OpenEnvError):
    """Raised and handled inside a server, where it becomes an error frame or a close.

    It never reaches a client as an exception: the client sees the frame, as
    the matching ``ServerError``.
    """


# Keyed by the codes' values: ErrorCode is a StrEnum, so its members look these up.
_BY_CODE: dict[str, type[ServerError]] = {
    "INVALID_JSON": ProtocolError,
    "UNKNOWN_TYPE": ProtocolError,
    "VALIDATION_ERROR": EnvValidationError,
    "EXECUTION_ERROR": EnvExecutionError,
    "CAPACITY_REACHED": CapacityError,
    "FACTORY_ERROR": FactoryError,
    "SESSION_ERROR": SessionError,
    "TIMEOUT": DeadlineError,
    "UNKNOWN_TOOL": UnknownToolError,
    "EPISODE_FINISHED": EpisodeFinishedError,
}


def server_error(code: ErrorCode, message: str, details: dict[str, Any]) -> ServerError:
    """Build the exception class that matches an error frame's code."""
    return _BY_CODE.get(code, ServerError)(code, message, details)
