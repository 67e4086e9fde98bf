"""What of a failure reaches a client, and what of a request reaches the logs.

Exception text from environment code often holds what no client should read
(``could not connect to postgres://admin:PASSWORD@db``): a client gets the
exception's type, and its message only when the environment raised an
``EnvError`` (or the server runs with ``error_details=True``). The server log
keeps the full text and traceback.

uvicorn writes each request's path and query to its logs, and a browser
passes the API key as ``?api_key=``, OpenEnv's client a session's id (the one
key to that session) as ``/ws?session_id=``: ``redact_api_keys`` installs a
filter on uvicorn's loggers that blanks both out.
"""

from __future__ import annotations

import contextvars
import logging
import re
from typing import Any

from openenv.errors import EnvError
from openenv.protocol_mcp_sessions import SESSION_QUERY

__all__ = ["ApiKeyFilter", "failure_text", "log_failure", "redact_api_keys"]

# uvicorn's request lines (access log) and WebSocket handshakes (error log, INFO).
_LOGGERS = ("uvicorn.access", "uvicorn.error")
# ``api_key=`` (and ``session_id=``) with any of its characters percent-encoded
# (``api%5Fkey=``) too: the server takes only the plain name, but a key sent
# under another spelling is as secret.
_NAMES = "|".join(
    "".join(f"(?:{re.escape(c)}|%{ord(c):02x})" for c in name)
    for name in ("api_key", SESSION_QUERY)
)
_API_KEY = re.compile(rf"(?i)((?<!\w)(?:{_NAMES})=)[^&#\s\"]*")


def failure_text(exc: BaseException, details: bool = False) -> str:
    """``Type: message`` for an ``EnvError`` (or with ``details``), else just the type.

    >>> failure_text(EnvError("no such word"))
    'EnvError: no such word'
    >>> failure_text(ValueError("postgres://admin:hunter2@db"))
    'ValueError (its message is in the server log; an EnvError message reaches clients)'
    """
    name = type(exc).__name__
    if details or isinstance(exc, EnvError):
        return f"{name}: {exc}"
    return f"{name} (its message is in the server log; an EnvError message reaches clients)"


def log_failure(
    log: logging.Logger | logging.LoggerAdapter[Any], what: str, exc: BaseException
) -> None:
    """Log that ``what`` raised ``exc``: an ``EnvError``, the environment's word to
    its client, as one INFO line (agents repeat a mistake by the thousand); any
    other exception at ERROR, with its traceback."""
    if isinstance(exc, EnvError):
        log.info("%s raised %s", what, failure_text(exc))
    else:
        log.error("%s raised", what, exc_info=exc)


class ApiKeyFilter(logging.Filter):
    """Replaces the value of every ``api_key=`` and ``session_id=`` in a log
    record's arguments with ``***``.

    >>> record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0,
    ...     '%s - "%s %s"', ("1.2.3.4:5", "GET", "/web?api_key=s3cret&x=1"), None)
    >>> ApiKeyFilter().filter(record), record.getMessage()
    (True, '1.2.3.4:5 - "GET /web?api_key=***&x=1"')
    >>> _redacted("/ws?session_id=8d61a3&api_key=k")
    '/ws?session_id=***&api_key=***'
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {name: _redacted(arg) for name, arg in record.args.items()}
        if isinstance(record.msg, str) and "=" in record.msg:
            record.msg = _API_KEY.sub(r"\1***", record.msg)
        return True


def _redacted(value: object) -> object:
    if isinstance(value, str) and "=" in value:
        return _API_KEY.sub(r"\1***", value)
    return value


# Set in the task that answered a WebSocket upgrade with a 401/403 denial response.
DENIED: contextvars.ContextVar[bool] = contextvars.ContextVar("openenv_denied", default=False)


class DeniedHandshakeFilter(logging.Filter):
    """Drops uvicorn's "returned without completing handshake" for a refusal we sent.

    uvicorn logs that error after any WebSocket app that answers the upgrade
    with an HTTP response (a documented ASGI extension) rather than accepting:
    for a correct 401/403 it is noise. The record is logged in the task that
    ran the app, so the flag set there tells the two apart.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (DENIED.get() and "without completing handshake" in str(record.msg))


def redact_api_keys() -> None:
    """Install ``ApiKeyFilter`` (and ``DeniedHandshakeFilter``) on uvicorn's loggers, once."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ApiKeyFilter) for f in logger.filters):
            logger.addFilter(ApiKeyFilter())
    error_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, DeniedHandshakeFilter) for f in error_log.filters):
        error_log.addFilter(DeniedHandshakeFilter())
