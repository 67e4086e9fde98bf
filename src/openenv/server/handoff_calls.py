"""What travels through the thread hand-over (``server/handoff.py``): calls,
batches, the tickets that say whose they are, the way back to the loop, and
the fast lane's threads that carry them.

A call or a batch is made on the loop thread, run on a worker thread, and its
outcome queued on its ``Home`` (the loop it came from), which the loop drains
in one callback for all outcomes that came back meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from openenv.errors import ServerSideError

__all__ = [
    "ENDED",
    "Batch",
    "BatchCall",
    "BatchReceiver",
    "Call",
    "Home",
    "LaneTicket",
    "NotStarted",
    "Receiver",
    "SubmittedCall",
    "Worker",
    "outcome",
    "outcome_of",
    "run",
]

ENDED = "the session ended before the call started"

_NO_KWARGS: dict[str, Any] = {}  # never mutated


class NotStarted(ServerSideError):
    """The call's ticket was closed before a thread took the call; it never ran."""


class LaneTicket:
    """Which lane one caller (a session) uses; calls of one ticket never overlap."""

    __slots__ = ("closed", "slow")

    def __init__(self) -> None:
        self.slow = 0  # > 0: quick calls still needed before returning to the fast lane
        self.closed = False  # True: calls not yet taken by a thread fail with NotStarted


class Receiver(Protocol):
    """Where a call's outcome goes, on the loop thread: an ``asyncio.Future``, or
    any object that answers the same three methods (a callback, without a future
    or a task to wake)."""

    def cancelled(self) -> bool: ...
    def set_result(self, result: Any, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


class BatchReceiver(Protocol):
    """Where the outcomes of a ``dispatch_batch`` go, on the loop thread: each
    ``(index, ok, value)`` once, in groups of those that came back together."""

    def batch_outcomes(self, outcomes: list[tuple[int, bool, Any]], /) -> None: ...


class Home:
    """Where outcomes go back to: one event loop, and its batch of finished calls.

    Each call keeps the home of the loop it came from, so one handoff shared
    by two loops (one app served by two servers in one process) hands each
    outcome back on its own loop's thread.
    """

    __slots__ = ("batch_done", "done", "loop", "notified")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.done: deque[tuple[Call, bool, Any]] = deque()
        self.batch_done: deque[Batch] = deque()  # batches with outcomes to deliver
        self.notified = False

    def notify(self) -> None:
        """Have the loop deliver what is done (once until it has); any thread."""
        if not self.notified:
            self.notified = True
            # A closed loop raises RuntimeError: nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.deliver)

    def deliver(self) -> None:
        self.notified = False
        batch_done = self.batch_done
        while batch_done:
            batch = batch_done.popleft()
            batch.flagged = False  # before taking its outcomes: a later one flags it again
            outcomes = batch.outcomes
            # Only this thread takes from it; the threads running the batch append.
            taken = [outcomes.popleft() for _ in range(len(outcomes))]
            if not taken:  # two threads of one batch both queued it; the first took all
                continue
            try:
                batch.receiver.batch_outcomes(taken)
            except Exception as exc:  # a receiver's bug must not lose the rest of the batch
                self._receiver_raised(exc)
        done = self.done
        while done:
            call, ok, value = done.popleft()
            future = call.future
            if future.cancelled():
                continue
            try:
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
            except Exception as exc:  # a receiver's bug must not lose the rest of the batch
                self._receiver_raised(exc)

    def _receiver_raised(self, exc: Exception) -> None:
        self.loop.call_exception_handler({"message": "a handoff receiver raised", "exception": exc})


class Call:
    """One call handed over on its own (``Handoff.submit``/``dispatch``)."""

    __slots__ = ("args", "dropped", "fn", "future", "home", "kwargs", "started", "ticket")

    def __init__(
        self,
        ticket: LaneTicket,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        future: Receiver,
        home: Home,
    ) -> None:
        self.ticket = ticket
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.future = future
        self.home = home
        self.started = 0.0  # when a thread began it (monotonic); 0.0: not yet
        self.dropped = False  # refused by drop_queued before any thread took it


class Batch:
    """Calls handed over together; any thread running the batch takes the next one."""

    __slots__ = ("calls", "flagged", "home", "outcomes", "queued", "receiver")

    def __init__(
        self,
        calls: deque[tuple[int, LaneTicket, Callable[..., Any], tuple[Any, ...]]],
        receiver: BatchReceiver,
        home: Home,
    ) -> None:
        self.calls = calls  # (index, ticket, fn, args); popleft is atomic, so threads share it
        self.receiver = receiver
        self.home = home
        self.queued = True  # in the fast lane, waiting for a thread to take it
        self.outcomes: deque[tuple[int, bool, Any]] = deque()  # not yet delivered
        self.flagged = False  # in its home's batch_done

    def returned(self, index: int, ok: bool, value: Any) -> None:
        """Queue one call's outcome for the loop (any thread; appends are atomic)."""
        self.outcomes.append((index, ok, value))
        if not self.flagged:
            self.flag()

    def flag(self) -> None:
        """Have the loop deliver this batch's outcomes (once until it has)."""
        self.flagged = True
        self.home.batch_done.append(self)
        self.home.notify()


class BatchCall:
    """A receiver for one call of a batch that runs on its own (the slow lane)."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: Batch, index: int) -> None:
        self.batch = batch
        self.index = index

    def cancelled(self) -> bool:
        return False

    def set_result(self, result: Any, /) -> None:
        self.batch.receiver.batch_outcomes([(self.index, True, result)])

    def set_exception(self, exception: BaseException, /) -> None:
        self.batch.receiver.batch_outcomes([(self.index, False, exception)])


class SubmittedCall(asyncio.Future[Any]):
    """``Handoff.submit``'s future: ``started()`` tells whether a thread runs it yet."""

    _call: Call | None = None

    def started(self) -> float | None:
        """When a thread began the call (``time.monotonic()``), or ``None`` if none has."""
        call = self._call
        return call.started or None if call is not None else None


def run(call: Call) -> tuple[Call, bool, Any]:
    return (call, *outcome(call.ticket, call.fn, call.args, call.kwargs))


def outcome(
    ticket: LaneTicket,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] = _NO_KWARGS,
) -> tuple[bool, Any]:
    """Run ``fn`` (unless its ticket has closed): ``(True, result)`` or ``(False, error)``."""
    if ticket.closed:
        return (False, NotStarted(ENDED))
    try:
        return (True, fn(*args, **kwargs))
    except BaseException as exc:
        return outcome_of(exc)


def outcome_of(exc: BaseException) -> tuple[bool, Any]:
    """``(False, error)`` for what a call raised: ``exc``, or what stands for it."""
    if isinstance(exc, StopIteration):  # a future cannot carry it, as in run_in_executor
        return (False, RuntimeError(f"StopIteration: {exc}"))
    if isinstance(exc, GeneratorExit):
        # Nor this one: thrown into the awaiting coroutine, it closes every
        # coroutine awaiting it and surfaces in the outermost one (the
        # connection's task, MCP's task group), past every handler in between.
        error = RuntimeError(f"GeneratorExit: {exc}")
        error.__cause__ = exc
        return (False, error)
    return (False, exc)  # handed to the awaiting coroutine


class Worker:
    """A thread of the fast lane, and what the watch reads of it."""

    __slots__ = ("batch", "current", "detached", "started", "thread", "wake")

    def __init__(self, work: Callable[[Worker], None]) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()  # held = asleep; released by the loop to wake the worker
        self.current: LaneTicket | None = None  # the ticket of the call it runs
        self.batch: Batch | None = None  # the batch it takes its calls from
        self.started = 0.0
        self.detached = False  # left the fast lane while blocked; ends after its call
        self.thread = threading.Thread(
            target=work, args=(self,), name="openenv-env-fast", daemon=True
        )
        self.thread.start()
