"""A client that leaves while it waits in line for a slot leaves the line at once.

Every transport tells ``EnvService.admit`` the same way that its client has
gone (a ``ClientLeft``), and admission races its wait for a slot against it:
a client gone neither counts in ``queued_sessions`` (pools and fleets subtract
it from the room they see) nor holds its place until ``queue_timeout``, and
no environment is made for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from openenv.server.direct import DirectChannel
from openenv.server.slots import SessionRegistry

__all__ = ["CancelsWhenLeft", "ChannelLeft", "ClientLeft", "acquire_unless_left"]


class ClientLeft(Protocol):
    """Whether a client has left, and a wait for it to: an ``asyncio.Event`` is one."""

    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


class ChannelLeft:
    """A WebSocket's ``ClientLeft``, read off its ``DirectChannel``. Frames it sent
    meanwhile stay queued for the session; a disconnect is put behind them."""

    __slots__ = ("_channel",)

    def __init__(self, channel: DirectChannel) -> None:
        self._channel = channel

    def is_set(self) -> bool:
        return self._channel.disconnected

    async def wait(self) -> None:
        # One waiter at a time on the channel: the session's reads begin only
        # once admission (this wait's only user) is over.
        while not self._channel.disconnected:
            await self._channel.arrival()


class CancelsWhenLeft:
    """The ``ClientLeft`` of a transport that cancels admission itself when its
    client leaves (v2 cancels the opens a closed connection waits on): it is read
    only once a slot is granted, so that a slot freed to a gone client makes no
    environment."""

    __slots__ = ("_left",)

    def __init__(self, left: Callable[[], bool]) -> None:
        self._left = left

    def is_set(self) -> bool:
        return self._left()

    async def wait(self) -> None:
        await asyncio.get_running_loop().create_future()  # the transport cancels


async def acquire_unless_left(registry: SessionRegistry, wait: float, left: ClientLeft) -> bool:
    """``registry.acquire(wait)``, given up as soon as the client leaves.

    Returns whether a slot is held (never one for a client that left). Safe to
    cancel: a cancelled wait holds no slot.
    """
    if registry.try_acquire():  # room at once: no tasks to race
        if not left.is_set():
            return True
        registry.release()
        return False
    if wait <= 0 or left.is_set():
        return False
    acquiring = asyncio.ensure_future(registry.acquire(wait))
    leaving = asyncio.ensure_future(left.wait())
    try:
        await asyncio.wait((acquiring, leaving), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this task was cancelled
        leaving.cancel()
        # A cancelled acquire() passes on a slot granted as it is cancelled; one
        # that had already returned holds it.
        if not acquiring.cancel() and _granted(acquiring):
            registry.release()
        raise
    leaving.cancel()
    if acquiring.cancel():
        with contextlib.suppress(asyncio.CancelledError):
            await acquiring  # out of the line before the refusal is sent
        return False
    if not acquiring.result():
        return False
    if left.is_set():  # granted and left in the same moment: the slot goes on
        registry.release()
        return False
    return True


def _granted(acquiring: asyncio.Future[bool]) -> bool:
    return not acquiring.cancelled() and acquiring.exception() is None and acquiring.result()
