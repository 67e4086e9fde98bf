"""Calling environment code: ``async def`` on the loop, plain ``def`` on a worker thread.

A deadline cancels an ``async def`` call. A thread cannot be killed, so a
plain ``def`` that overruns is left running and handed back to the caller as
``DeadlineExceeded.stuck``: a future that completes when the thread returns.
The deadline of a call on a worker thread counts from the moment a thread
starts it (when its future can tell, as ``Handoff.submit``'s can): a call
that waits for a free thread has not overrun anything yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, Protocol, cast

from openenv.errors import ServerSideError

__all__ = ["DeadlineExceeded", "Submit", "being_cancelled", "call", "on_executor", "start"]


class Submit(Protocol):
    """Starts ``fn(*args, **kwargs)`` on a worker thread; the future gets its outcome.

    ``timed``: the caller has a deadline for the call.
    """

    def __call__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        /,
        *,
        timed: bool = False,
    ) -> asyncio.Future[Any]: ...


class DeadlineExceeded(ServerSideError):
    """A call overran its deadline; ``stuck`` is set when its thread still runs."""

    def __init__(self, seconds: float, stuck: asyncio.Future[Any] | None) -> None:
        super().__init__(f"did not return within {seconds:g}s")
        self.seconds = seconds
        self.stuck = stuck


def on_executor(executor: Executor) -> Submit:
    """A ``Submit`` that runs calls on a plain executor (for rare, possibly slow calls)."""

    def submit(
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        /,
        *,
        timed: bool = False,
    ) -> asyncio.Future[Any]:
        return asyncio.wrap_future(executor.submit(fn, *args, **kwargs))

    return submit


async def call(
    fn: Callable[..., Any],
    *args: Any,
    submit: Submit,
    timeout: float | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``fn`` without blocking the event loop, within ``timeout`` seconds."""
    if timeout is None:
        result = await start(fn, args, kwargs, submit)
    elif is_async(fn):
        try:
            async with asyncio.timeout(timeout):
                return await fn(*args, **kwargs)
        except TimeoutError:
            raise DeadlineExceeded(timeout, None) from None
    else:
        future = submit(fn, args, kwargs, timed=True)
        if not await _settled_within(future, timeout):
            future.add_done_callback(_consume)
            raise DeadlineExceeded(timeout, future)
        result = future.result()
    if inspect.isawaitable(result):
        result = await result  # a plain def that returned a coroutine
    return result


async def _settled_within(future: asyncio.Future[Any], timeout: float) -> bool:
    """Wait up to ``timeout`` for ``future``; never cancel it (its thread runs on).

    What ``asyncio.timeout`` around ``asyncio.shield`` does, with one future
    and one timer instead of two futures, a timeout manager and a timer: it
    runs for every environment made and closed.
    """
    if future.done():
        return True
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    started_at = getattr(future, "started", None)
    try:
        while True:
            timer = loop.call_later(timeout, wake)
            try:
                await waiter
            finally:
                timer.cancel()
            if future.done() or started_at is None:
                break
            # Count only the time since a thread took the call.
            started = started_at()
            if started is None:
                remaining = timeout
            else:
                remaining = started + timeout - time.monotonic()
                if remaining <= 0:
                    break
            waiter = loop.create_future()
            timeout = remaining
    finally:
        future.remove_done_callback(wake)
    return future.done()


def start(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], submit: Submit
) -> Awaitable[Any]:
    """Start ``fn`` where it belongs: its coroutine, or its future on a worker thread.

    Without a deadline this is all a call needs, one await and no wrapper
    coroutine; a plain ``def`` may still return an awaitable, for the caller
    to await in turn.
    """
    if is_async(fn):
        return cast(Awaitable[Any], fn(*args, **kwargs))
    return submit(fn, args, kwargs)


# Whether a function is ``async def``, by the function under a bound method:
# asked on every step, and inspect's answer never changes for a function.
_ASYNC: weakref.WeakKeyDictionary[Callable[..., Any], bool] = weakref.WeakKeyDictionary()


def is_async(fn: Callable[..., Any]) -> bool:
    func = getattr(fn, "__func__", fn)
    try:
        return _ASYNC[func]
    except (KeyError, TypeError):  # TypeError: not weak-referenceable (e.g. a builtin)
        answer = inspect.iscoroutinefunction(fn)
        with contextlib.suppress(TypeError):
            _ASYNC[func] = answer
        return answer


def being_cancelled() -> bool:
    """Whether the running task has been asked to cancel (rather than some
    coroutine it awaited raising ``CancelledError`` on its own)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _consume(future: asyncio.Future[Any]) -> None:
    # Nobody awaits an abandoned call's outcome; read it so asyncio does not warn.
    if not future.cancelled():
        future.exception()
