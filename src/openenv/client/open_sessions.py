"""The sessions a ``MuxClient`` has open on its server, by key, held weakly.

A ``MuxSession`` holds its client, so that a caller who keeps only the
sessions keeps them usable. Were the client to hold its sessions as well, a
client dropped unclosed would live on in that cycle until Python's cycle
collector ran, its connection (and every slot of its sessions) with it:
a script opening a client a round would fill the server's cap meanwhile.
Here the client holds them weakly, and a session dropped while its client
lives still counts, and is closed with the client, until the server has
closed it.

>>> class Session:
...     pass
>>> sessions, held = OpenSessions(), Session()
>>> sessions[0], sessions[1] = held, Session()  # the second is dropped at once
>>> len(sessions), 1 in sessions, sessions.values() == [held]
(2, True, True)
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from openenv.protocol_v2 import SessionKey

if TYPE_CHECKING:
    from openenv.client.mux import MuxSession

__all__ = ["OpenSessions"]


class OpenSessions:
    """Session keys the server has open, each with its session if still held."""

    def __init__(self) -> None:
        self._refs: dict[SessionKey, weakref.ref[MuxSession]] = {}

    def __len__(self) -> int:
        return len(self._refs)

    def __contains__(self, key: object) -> bool:
        return key in self._refs

    def __setitem__(self, key: SessionKey, session: MuxSession) -> None:
        self._refs[key] = weakref.ref(session)

    def pop(self, key: SessionKey, default: None = None) -> MuxSession | None:
        """Forget ``key``; its session, if still held."""
        ref = self._refs.pop(key, None)
        return ref() if ref is not None else default

    def items(self) -> list[tuple[SessionKey, MuxSession | None]]:
        """Every open key, with its session (``None``: dropped, yet open on the server)."""
        return [(key, ref()) for key, ref in self._refs.items()]

    def values(self) -> list[MuxSession]:
        """The open sessions still held."""
        return [s for ref in self._refs.values() if (s := ref()) is not None]

    def clear(self) -> None:
        self._refs.clear()
