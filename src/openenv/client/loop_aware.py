"""Client methods that are awaitable inside an event loop and blocking outside one.

OpenEnv's clients, and TRL's documented ``environment_factory`` pattern on top
of them, call ``env.reset()`` / ``env.step(action)`` from plain synchronous code.
A bare coroutine there would be dropped unawaited and the training loop would
read an exception's text instead of an observation. So each public client
method looks at the calling thread: with no running event loop it runs the
call on the shared background loop (``openenv.client.sync``) and returns the
result; inside a running loop it returns the coroutine, for ``await``.

A WebSocket connection belongs to the event loop that opened it; a call made
from another loop (sync first, then ``await`` on a trainer's own loop, say) is
carried over to that home loop instead of touching the socket from a foreign
one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from openenv.client.sync import blocked_loop, forked_away, run_sync
from openenv.errors import SessionClosedError

__all__ = [
    "HasHomeLoop",
    "abandoned",
    "close_when_dropped",
    "cut",
    "loop_aware",
    "on_home_loop",
]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class HasHomeLoop(Protocol):
    """A client whose connection lives on one event loop (``None`` until it connects)."""

    home_loop: asyncio.AbstractEventLoop | None


_C = TypeVar("_C", bound=HasHomeLoop)


async def on_home_loop(client: HasHomeLoop, make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Await ``make()`` on the loop that owns ``client``'s connection.

    The call's coroutine is made here, once this one runs: made by the caller,
    it was left never awaited (a ``RuntimeWarning`` as it was collected) when
    the call was cancelled before it started, e.g. one of a ``gather``'s calls.
    """
    home, here = client.home_loop, asyncio.get_running_loop()
    if home is None or home is here:
        return await make()
    if home.is_closed() or not home.is_running():
        raise SessionClosedError(
            "this client's connection was opened on an event loop that has stopped; "
            "create a new client"
        )
    if forked_away(home):
        # Its socket is the parent's too: a word on it here would be heard there.
        raise SessionClosedError(
            "this client's connection belongs to the process this one was forked from; "
            "create a new client"
        )
    if blocked_loop(home):
        # Its thread waits for this very call (a blocking method called inside
        # the loop that opened the connection): carrying the call there would
        # wait for ever.
        raise RuntimeError(
            "this client's connection lives on the event loop that is blocked waiting "
            "for this call; inside that loop, await the client's methods instead of "
            "calling its blocking ones (.sync(), with)"
        )
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), home))


def abandoned(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether no thread runs ``loop`` (closed or stopped), or it is the loop of the
    process this one was forked from: what lives on it can only be cut."""
    return loop.is_closed() or not loop.is_running() or forked_away(loop)


def cut(transport: asyncio.BaseTransport, loop: asyncio.AbstractEventLoop) -> None:
    """Cut the connection of ``transport``, whose ``loop`` is ``abandoned``: the
    peer hears the end of the stream (a server frees the session's slot)."""
    if forked_away(loop):
        return  # the parent's connection too: a word on it here would end it there
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already gone
            sock.shutdown(socket.SHUT_RDWR)


def loop_aware(
    method: Callable[Concatenate[_C, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[_C, _P], Coroutine[Any, Any, _T]]:
    """Make an ``async def`` client method blocking when no event loop runs in the caller.

    Type checkers keep seeing a coroutine method, so ``await client.step(...)``
    stays typed; plain synchronous callers get the result itself.
    """

    @functools.wraps(method)
    def call(self: _C, /, *args: _P.args, **kwargs: _P.kwargs) -> Coroutine[Any, Any, _T]:
        coro = on_home_loop(self, functools.partial(method, self, *args, **kwargs))
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # The declared type is the coroutine's, for ``await`` users; here
            # the caller is synchronous and gets the value it would await.
            return cast(Coroutine[Any, Any, _T], run_sync(coro))
        return coro

    return call


def close_when_dropped(
    owner: object, transport: asyncio.BaseTransport, loop: asyncio.AbstractEventLoop
) -> weakref.finalize[Any, Any]:
    """Close ``transport`` on ``loop`` once ``owner`` is garbage-collected unclosed.

    A connection's keepalive keeps it (and its session's slot on the server)
    alive on the loop for as long as the loop runs, long after the client
    object that could close it is gone. Dropped, it is cut (the server frees
    the slot on the disconnect), at once: a closing handshake would need a
    task that a loop about to end (``asyncio.run`` returning) may cancel
    half-way. ``detach()`` the result on ``close``.
    """
    # Weakly: a transport whose loop has ended must go with its client, as before.
    finalizer = weakref.finalize(owner, _close_on, weakref.ref(transport), loop)
    finalizer.atexit = False  # at exit the process's sockets go anyway
    return finalizer


def _close_on(
    transport: weakref.ref[asyncio.BaseTransport], loop: asyncio.AbstractEventLoop
) -> None:
    if not loop.is_closed():
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing can run there
            loop.call_soon_threadsafe(_abort, transport)


def _abort(transport: weakref.ref[asyncio.BaseTransport]) -> None:
    alive = transport()
    if isinstance(alive, asyncio.WriteTransport):
        alive.abort()
    elif alive is not None:
        alive.close()
