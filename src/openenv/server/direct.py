"""The ``openenv.direct`` ASGI extension: what an app may ask of a connection.

``server/wsprotocol.py`` offers it; ``server/endpoint.py`` uses it when it is
offered, and plain ASGI when it is not (uvicorn's stock protocols, other
servers). It lives apart from the protocol so that the endpoint never
imports uvicorn's internals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["DIRECT", "NOTIFY", "DirectChannel"]

# The scope extension that offers a connection's ``DirectChannel``.
DIRECT = "openenv.direct"
# The message ``DirectChannel.notify`` puts before the app's ``receive``.
NOTIFY = "openenv.notify"


class DirectChannel(Protocol):
    """Frames in and out of one connection without the ASGI ``receive``/``send`` round."""

    disconnected: bool  # the peer is gone

    def take_frames(self, handler: Callable[[str | bytes], bool] | None) -> None:
        """Offer every data frame to ``handler`` first, on the loop, in the protocol's
        callback, while the app's queue is empty and the socket writable; frames it
        declines (``False``) go to ``receive`` as usual. ``None`` stops it."""

    def send_now(self, text: str) -> bool:
        """Send a text frame at once; ``False`` when the connection is closing or gone."""

    def send_text(self, text: str) -> bool:
        """Send a text frame if ``send`` would write it without waiting (the socket
        is writable); ``False``: await ``send`` instead."""

    def write_blocked(self) -> bool:
        """The write buffer is over its high-water mark (the peer is not reading
        what was sent), so the connection is not read either."""

    def receive_nowait(self) -> Any:
        """``receive``'s next message if one is queued, else ``None``: then await
        ``arrival()`` and ask again. No coroutine per message."""

    def arrival(self) -> asyncio.Future[None]:
        """Done once ``receive`` has a message (one waiter at a time)."""

    def notify(self) -> None:
        """Hand the app's ``receive`` a ``{"type": NOTIFY}`` message."""

    def set_send_timeout(self, seconds: float | None) -> None:
        """Abort the connection once its peer has not drained the write buffer for
        ``seconds`` (``None``: never)."""

    def abort(self) -> None:
        """Drop the connection at once, unsent bytes and all (no close handshake)."""
