"""Calling environment code: ``async def`` on the loop, plain ``def`` in a worker thread.

A deadline cancels an ``async def`` call. A thread cannot be killed, so a
plain ``def`` that overruns is left running and handed back to the caller as
``DeadlineExceeded.stuck``: a future that completes when the thread returns.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

__all__ = ["DeadlineExceeded", "call"]


class DeadlineExceeded(Exception):
    """A call overran its deadline; ``stuck`` is set when its thread still runs."""

    def __init__(self, seconds: float, stuck: asyncio.Future[Any] | None) -> None:
        super().__init__(f"did not return within {seconds:g}s")
        self.seconds = seconds
        self.stuck = stuck


async def call(
    fn: Callable[..., Any],
    *args: Any,
    executor: Executor,
    timeout: float | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``fn`` without blocking the event loop, within ``timeout`` seconds."""
    if inspect.iscoroutinefunction(fn):
        if timeout is None:
            return await fn(*args, **kwargs)
        try:
            async with asyncio.timeout(timeout):
                return await fn(*args, **kwargs)
        except TimeoutError:
            raise DeadlineExceeded(timeout, None) from None
    work = executor.submit(fn, *args, **kwargs)
    future = asyncio.wrap_future(work)
    if timeout is None:
        result = await future
    else:
        try:
            async with asyncio.timeout(timeout):
                result = await asyncio.shield(future)
        except TimeoutError:
            if work.cancel():  # still queued behind busy threads: it never ran
                raise DeadlineExceeded(timeout, None) from None
            future.add_done_callback(_consume)
            raise DeadlineExceeded(timeout, future) from None
    if inspect.isawaitable(result):  # a plain def that returned a coroutine
        result = await result
    return result


def _consume(future: asyncio.Future[Any]) -> None:
    # Nobody awaits an abandoned call's outcome; read it so asyncio does not warn.
    if not future.cancelled():
        future.exception()
