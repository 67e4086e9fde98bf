"""Which uvicorn protocol classes ``openenv serve`` runs: openenv's fast ones, or uvicorn's own.

openenv's WebSocket and HTTP protocols (``server/wsprotocol.py``,
``server/httpprotocol.py``) subclass uvicorn's and reach into uvicorn's and
websockets' implementation, which no public interface offers. So they are
used only with the releases they were tested with (``TESTED``; the
dependency bounds in ``pyproject.toml`` say the same). Given anything else, a
server starts on uvicorn's stock protocols instead, with one warning line:
slower on small frames, but correct, and with everything openenv's sessions
need (deadlines, drain, caps) working, since those live above the protocol.

``OPENENV_STOCK_PROTOCOLS=1`` chooses uvicorn's protocols on purpose.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import version
from typing import Any

__all__ = ["TESTED", "default_protocols", "untested_reason"]

logger = logging.getLogger("openenv.server")

# The releases (by their first two version parts) the fast protocols are tested with.
TESTED: dict[str, tuple[str, ...]] = {"uvicorn": ("0.54",), "websockets": ("17",)}

_warned: set[str] = set()  # each reason once per process


def untested_reason(versions: dict[str, str] | None = None) -> str | None:
    """Why the fast protocols must not be used here (``None``: they may).

    >>> untested_reason({"uvicorn": "0.54.0", "websockets": "17.4"}) is None
    True
    >>> untested_reason({"uvicorn": "0.60.1", "websockets": "17.4"})
    'uvicorn 0.60.1 (tested: 0.54)'
    """
    found = versions if versions is not None else {name: version(name) for name in TESTED}
    for name, series in TESTED.items():
        release = found.get(name, "")
        if not any(release == s or release.startswith(f"{s}.") for s in series):
            return f"{name} {release or 'missing'} (tested: {', '.join(series)})"
    return None


def default_protocols(versions: dict[str, str] | None = None) -> tuple[Any, Any]:
    """The ``ws`` and ``http`` options for ``uvicorn.Config``: classes, or uvicorn's names."""
    if os.environ.get("OPENENV_STOCK_PROTOCOLS") == "1":
        return "websockets-sansio", "httptools"
    reason = untested_reason(versions)
    if reason is None:
        try:
            from openenv.server.httpprotocol import HttpToolsProtocol
            from openenv.server.wsprotocol import WebSocketProtocol
        except ImportError as exc:  # a release that moved what they build on
            reason = f"{type(exc).__name__}: {exc}"
        else:
            return WebSocketProtocol, HttpToolsProtocol
    if reason not in _warned:
        _warned.add(reason)
        logger.warning(
            "openenv: %s; serving with uvicorn's own protocols, correct but slower", reason
        )
    return "websockets-sansio", "httptools"
