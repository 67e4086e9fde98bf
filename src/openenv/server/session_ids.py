"""Session ids for HTTP-driven sessions: unguessable, and checkable as this server's own.

HTTP has no connection to hold a session, so its id is the only key to it:
128 random bits, then a MAC of them under a secret made per process, so an
id can be told to be one this server issued (a session since ended) from one
it never did, without remembering every id. OpenReward's routes
(``server/openreward.py``) and OpenEnv's ``/mcp`` sessions
(``server/openenv_mcp.py``) issue theirs here.

>>> ids = SessionIds()
>>> sid = ids.new()
>>> len(sid), ids.issued(sid), ids.issued("0" * 48), SessionIds().issued(sid)
(48, True, False, False)
>>> ended = EndedSessions(kept=2)
>>> [ended.add(n, "idle_timeout") for n in "abc"][-1]
'idle timeout'
>>> ended.get("a"), ended.get("c")
(None, 'idle timeout')
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections import OrderedDict

__all__ = ["EndedSessions", "SessionIds"]

_TOKEN = 32  # hex digits of randomness
_MAC = 16  # hex digits of the MAC after them


class SessionIds:
    """Issue session ids, and tell this issuer's from any other string."""

    def __init__(self) -> None:
        self._secret = os.urandom(32)

    def new(self) -> str:
        token = os.urandom(_TOKEN // 2).hex()
        return token + self._mac(token)

    def issued(self, sid: str) -> bool:
        """Whether ``sid`` is an id ``new`` made (in this process)."""
        return len(sid) == _TOKEN + _MAC and hmac.compare_digest(
            sid[_TOKEN:], self._mac(sid[:_TOKEN])
        )

    def _mac(self, token: str) -> str:
        return hmac.new(self._secret, token.encode(), hashlib.sha256).hexdigest()[:_MAC]


class EndedSessions:
    """Why each of the last ``kept`` ended sessions ended, to say so to a late request."""

    def __init__(self, kept: int = 10_000) -> None:
        self._kept = kept
        self._why: OrderedDict[str, str] = OrderedDict()

    def add(self, sid: str, reason: str) -> str:
        """Remember why ``sid`` ended (``idle_timeout``); return it in words (``idle timeout``)."""
        why = self._why[sid] = reason.replace("_", " ")
        while len(self._why) > self._kept:
            self._why.popitem(last=False)
        return why

    def get(self, sid: str) -> str | None:
        return self._why.get(sid)

    def forget(self, sid: str) -> None:
        self._why.pop(sid, None)
