"""The two objects uvicorn's WebSocket protocol waits on, made lighter for ``wsprotocol``.

uvicorn's ``websockets-sansio`` protocol keeps incoming messages on an
``asyncio.Queue`` and its writability on an ``asyncio.Event``; these keep
the same duck-typed interface with less work per message.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Flag", "Inbox"]


class Inbox:
    """What uvicorn's protocol needs of its ``asyncio.Queue``, with one waiter at most.

    A list, not a deque: it rarely holds more than one message, and an empty
    deque costs some 600 bytes per connection.
    """

    __slots__ = ("_items", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._items: list[Any] = []
        self._loop = loop  # not asyncio.get_running_loop(): a getpid call per message
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def pop(self) -> Any:
        """The oldest message, or ``None`` when there is none."""
        items = self._items
        return items.pop(0) if items else None

    def arrival(self) -> asyncio.Future[None]:
        """Done once a message is put: ASGI has one consumer per connection, so
        one waiter suffices (a cancelled one is dropped at the next put)."""
        waiter = self._waiter = self._loop.create_future()
        return waiter

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)


class Flag:
    """What uvicorn's protocol needs of its ``writable`` ``asyncio.Event``, in less memory."""

    __slots__ = ("_loop", "_set", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = True
        self._waiters: list[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        while not self._set:
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
