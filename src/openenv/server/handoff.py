"""Run plain ``def`` environment calls on worker threads, cheaply and without stalls.

``loop.run_in_executor`` costs two futures, a queue hand-over and a loop
wake-up per call; for a cheap ``step`` that is most of the server's work.
``Handoff`` keeps one *fast lane*: calls go into a deque that an awake worker
drains, and results come back in batches, so a busy server pays one thread
wake-up and one loop wake-up per batch rather than per call. A sleeping
worker is woken once the loop has queued the calls of its current round,
never in the middle of it.

A blocking call never holds up the others for long. While work is queued, a
timer on the event loop checks the workers every ``blocking_after`` seconds:
when every awake worker is inside a call older than that, it wakes (or
starts) as many more to go on draining, up to ``max_threads``, so a burst
of blocking calls widens the lane by doubling. A session
whose call took longer than ``slow_after`` moves to the *slow lane*, a pool
of workers of its own, until its calls are quick again; so slow sessions
queue among themselves and the fast lane stays fast. (A worker merely
preempted by a busy machine looks stuck too; demoting on the finished call's
length, with a larger threshold, keeps such sessions in the fast lane.) The
slow lane hands results back the same way, in batches: a server full of
sleeping steps pays for their wake-ups, not for a ``concurrent.futures``
future, a condition and a loop wake-up per call. Threads of either lane that
find no work for ``idle_exit`` seconds end, so a burst leaves none behind.
User code never runs on the event loop thread.

Blocking calls never take the fast lane for good: when every fast thread is
inside a call older than ``stuck_after`` and the lane is at ``max_threads``
with work waiting, those threads leave the fast lane (they count against the
slow lane's cap, and once their call returns they end, or serve the slow
calls that queued meanwhile) and their sessions move to the slow lane, so
resets, new environments and quick sessions keep getting threads. At most
``2 * max_threads`` threads run at once; when both lanes are full of blocked
calls, ``starved`` says so (``/health`` reports "degraded"). A call whose
ticket is ``closed`` before a thread takes it never runs: its receiver gets
``NotStarted``.

``dispatch_batch`` hands over many calls at once (the steps of one v2 frame)
as one entry of the fast lane, to save each call its own queue entry, receiver
and wake-ups. A batch keeps every promise above call by call: its calls run in
order, each outcome goes back as soon as it is there, a session that turns
slow leaves the fast lane, and when the thread running a batch is stuck in a
call, the watch puts the rest of the batch back in the lane for a helper to
go on with, so one slow call holds back only itself.

>>> import asyncio
>>> async def main() -> int:
...     handoff = Handoff(max_threads=2)
...     try:
...         return await handoff.call(LaneTicket(), sum, [1, 2, 3])
...     finally:
...         handoff.shutdown()
>>> asyncio.run(main())
6
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from openenv.server.handoff_calls import (
    ENDED,
    Batch,
    BatchCall,
    BatchReceiver,
    Call,
    Home,
    LaneTicket,
    NotStarted,
    Receiver,
    SubmittedCall,
    Worker,
    outcome_of,
    run,
)

__all__ = ["BatchReceiver", "Handoff", "LaneTicket", "NotStarted", "Receiver", "SubmittedCall"]

_monotonic = time.monotonic

# How many quick calls in a row bring a session back from the slow lane.
_SLOW_CREDITS = 16


class Handoff:
    """The fast lane (batched hand-over to a few workers) in front of a slow-lane pool."""

    def __init__(
        self,
        max_threads: int = 64,
        blocking_after: float = 0.01,
        slow_after: float = 0.02,
        idle_exit: float = 10.0,
        stuck_after: float = 0.5,
    ) -> None:
        self.max_threads = max_threads
        self.idle_exit = idle_exit  # a worker without work for this long ends its thread
        self.blocking_after = blocking_after
        self.slow_after = slow_after
        self.stuck_after = stuck_after
        self._pending: deque[Call | Batch] = deque()
        self._home: Home | None = None  # the last caller's loop
        self._lock = threading.Lock()
        self._workers: list[Worker] = []
        self._idle: list[Worker] = []
        self._active: list[Worker] = []
        self._kicking = False
        self._watching = False
        self._stopped = False
        # The slow lane: a queue, and workers that each run one call at a time.
        self._slow_queue: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._slow_workers: list[threading.Thread] = []
        self._slow_waiting = 0  # workers waiting on the queue, or about to
        self._slow_queued = 0  # calls in the queue that no worker has taken yet
        self._slow_calls: set[Call] = set()  # those calls, for drop_queued
        self._detached = 0  # fast threads moved out while blocked (count against the slow cap)
        self._fast_starved = False  # work waits and no fast thread can be woken or freed

    @property
    def starved(self) -> int:
        """Calls waiting with no thread free to take them (both lanes full of blocked calls)."""
        with self._lock:
            fast = len(self._pending) if self._fast_starved else 0
            return fast + max(0, self._slow_queued - self._slow_waiting)

    @property
    def threads(self) -> int:
        """Fast-lane threads running (idle ones end after ``idle_exit`` seconds)."""
        return len(self._workers)

    @property
    def slow_threads(self) -> int:
        """Slow-lane threads running (idle ones end after ``idle_exit`` seconds)."""
        return len(self._slow_workers)

    async def call(
        self, ticket: LaneTicket, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` on a worker thread and return (or raise) its result."""
        return await self.submit(ticket, fn, args, kwargs)

    def submit(
        self,
        ticket: LaneTicket,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        timed: bool = False,
    ) -> asyncio.Future[Any]:
        """Start ``fn(*args, **kwargs)`` on a worker thread; the future gets its outcome.

        Cancelling the future does not stop the call: a thread cannot be interrupted.
        ``timed``: the caller has a deadline for it, so the future is a
        ``SubmittedCall`` that says when a thread began it. Otherwise it is
        asyncio's own future: a Python subclass of it costs every await a slow
        path in the task that awaits it (a quarter of plain uvicorn's steps).
        """
        loop = asyncio.get_running_loop()
        if not timed:
            future = loop.create_future()
            self._dispatch_on(loop, ticket, fn, args, kwargs, future)
            return future
        timed_future = SubmittedCall(loop=loop)
        timed_future._call = self._dispatch_on(loop, ticket, fn, args, kwargs, timed_future)
        return timed_future

    def dispatch(
        self,
        ticket: LaneTicket,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        receiver: Receiver,
    ) -> None:
        """Start ``fn(*args, **kwargs)`` on a worker thread; ``receiver`` gets its outcome
        on the loop thread, in a batch with others (``submit`` without the future)."""
        self._dispatch_on(asyncio.get_running_loop(), ticket, fn, args, kwargs, receiver)

    def _dispatch_on(
        self,
        loop: asyncio.AbstractEventLoop,
        ticket: LaneTicket,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        receiver: Receiver,
    ) -> Call:
        home = self._home_on(loop)
        call = Call(ticket, fn, args, kwargs, receiver, home)
        if ticket.slow:
            self._submit_slow(call)
            return call
        self._pending.append(call)
        self._queued(loop)
        return call

    def dispatch_batch(
        self,
        calls: list[tuple[LaneTicket, Callable[..., Any], tuple[Any, ...]]],
        receiver: BatchReceiver,
    ) -> None:
        """Start ``fn(*args)`` for every ``(ticket, fn, args)`` of ``calls``, in order;
        ``receiver.batch_outcomes`` gets each ``(index, ok, value)`` on the loop
        thread as soon as it is there. The tickets must differ (one call per session)."""
        loop = asyncio.get_running_loop()
        home = self._home_on(loop)
        batch = Batch(deque(), receiver, home)
        fast = batch.calls
        for index, (ticket, fn, args) in enumerate(calls):
            if ticket.slow:
                self._submit_slow(Call(ticket, fn, args, {}, BatchCall(batch, index), home))
            else:
                fast.append((index, ticket, fn, args))
        if fast:
            self._pending.append(batch)
            self._queued(loop)

    def _home_on(self, loop: asyncio.AbstractEventLoop) -> Home:
        home = self._home
        if home is None or home.loop is not loop:
            home = self._home = Home(loop)
            # A watch scheduled on the previous loop may never run (its server
            # stopped): this loop gets its own.
            self._watching = False
        return home

    def _queued(self, loop: asyncio.AbstractEventLoop) -> None:
        """Work went into the fast lane: see that a worker comes, and that the watch runs."""
        if not self._kicking:
            # Wake a worker once the loop has queued this round's calls, not
            # for each: with the GIL handed back and forth between every
            # callback, a worker woken at once would run one call per wake-up.
            self._kicking = True
            loop.call_soon(self._kick)
        if not self._watching:
            self._watching = True
            loop.call_later(self.blocking_after, self._watch)

    def shutdown(self) -> None:
        """Let idle workers exit; busy ones exit after their call. Idempotent."""
        with self._lock:
            self._stopped = True
            idle, self._idle = self._idle, []
            slow = len(self._slow_workers)
        for worker in idle:
            worker.wake.release()
        for _ in range(slow):
            self._slow_queue.put(None)

    def drop_queued(self, ticket: LaneTicket) -> None:
        """Close ``ticket``: its calls that no thread has started never will, and
        their receivers get ``NotStarted`` now (those submitted later, once taken)."""
        ticket.closed = True
        dropped = []
        with self._lock:
            # list() of a deque is one step under the GIL: the workers' poplefts
            # cannot interleave with it.
            pending = list(self._pending)
            waiting = [c for c in pending if isinstance(c, Call) and c.ticket is ticket]
            waiting += [c for c in self._slow_calls if c.ticket is ticket]
            batches = {id(b): b for b in pending if isinstance(b, Batch)}
            batches.update((id(w.batch), w.batch) for w in self._active if w.batch is not None)
            for call in waiting:
                # A worker that took a call of a closed ticket sets ``started``
                # under this lock before running it: then it is not ours to drop.
                if call.started == 0.0 and not call.dropped:
                    call.dropped = True
                    dropped.append(call)
                    if call in self._slow_calls:
                        self._slow_calls.discard(call)
                        self._slow_queued -= 1
        for call in dropped:
            self._finish((call, False, NotStarted(ENDED)))
        for batch in batches.values():
            for entry in [e for e in list(batch.calls) if e[1] is ticket]:
                try:
                    batch.calls.remove(entry)  # atomic: a worker took it, or it never will
                except ValueError:
                    continue
                batch.returned(entry[0], False, NotStarted(ENDED))

    # -- loop thread --------------------------------------------------------

    def _submit_slow(self, call: Call) -> None:
        with self._lock:
            self._slow_queued += 1
            self._slow_calls.add(call)
            start = (
                self._slow_waiting < self._slow_queued
                and len(self._slow_workers) + self._detached < self.max_threads
                and not self._stopped
            )
            if start:
                thread = threading.Thread(
                    target=self._work_slow, name="openenv-env-slow", daemon=True
                )
                self._slow_workers.append(thread)
                self._slow_waiting += 1
        if start:
            thread.start()
        self._slow_queue.put(call)

    def _kick(self) -> None:
        self._kicking = False
        with self._lock:
            if self._pending and not self._active:
                self._wake_one()

    def _wake_one(self) -> None:
        """Wake an idle worker, or start one below the cap; caller holds the lock."""
        if self._idle:
            worker = self._idle.pop()
        elif len(self._workers) < self.max_threads and not self._stopped:
            worker = Worker(self._work)
            self._workers.append(worker)
        else:
            return  # every thread is busy; the watch keeps looking
        self._active.append(worker)
        worker.wake.release()

    def _watch(self) -> None:
        """While work waits, make sure some awake worker is not stuck in a long call."""
        with self._lock:
            self._fast_starved = False
            if not self._pending and not self._active:
                self._watching = False
                return
            stuck_before = _monotonic() - self.blocking_after
            for worker in self._active:
                batch = worker.batch
                blocked = 0.0 < worker.started < stuck_before
                if blocked and batch is not None and batch.calls and not batch.queued:
                    # The rest of its batch goes back in the lane, for a helper.
                    batch.queued = True
                    self._pending.appendleft(batch)
            if self._pending:
                active = self._active
                stuck = sum(0.0 < w.started < stuck_before for w in active)
                if stuck == len(active):
                    # Only wake helpers here: a worker that looks stuck may just have
                    # been preempted, and demoting its session would make a quick
                    # session queue behind slow ones. Demotion waits for the call's end.
                    # One helper per stuck worker: when many sessions arrive at once
                    # whose first calls block, the lane widens by doubling, not by one
                    # thread per tick while the quick calls queue behind them.
                    if len(self._workers) >= self.max_threads and not self._idle:
                        self._detach_blocked()
                    # Still full: nothing to wake, and the waiting calls wait.
                    full = len(self._workers) >= self.max_threads and not self._idle
                    self._fast_starved = full
                    for _ in range(min(max(1, stuck), len(self._pending))):
                        self._wake_one()
        loop = asyncio.get_running_loop()
        if self._home is not None and self._home.loop is loop:
            loop.call_later(self.blocking_after, self._watch)
        # Otherwise another loop has become home, with a watch of its own.

    def _detach_blocked(self) -> None:
        """Move fast threads blocked past ``stuck_after`` out of the fast lane (caller
        holds the lock), as far as the slow lane's cap allows; their sessions go slow."""
        blocked_before = _monotonic() - self.stuck_after
        room = self.max_threads - len(self._slow_workers) - self._detached
        for worker in list(self._active):
            if room <= 0:
                return
            ticket = worker.current
            if ticket is None or not 0.0 < worker.started < blocked_before:
                continue
            worker.detached = True
            ticket.slow = _SLOW_CREDITS
            self._active.remove(worker)
            self._workers.remove(worker)
            self._detached += 1
            room -= 1

    # -- worker threads -----------------------------------------------------

    def _work(self, worker: Worker) -> None:
        pending = self._pending
        while True:
            if not worker.wake.acquire(timeout=self.idle_exit):
                with self._lock:
                    if worker in self._idle:  # nobody is about to wake it: retire
                        self._idle.remove(worker)
                        self._workers.remove(worker)
                        return
                continue  # just woken; the release is already done
            if self._stopped and not pending:
                return
            while True:
                try:
                    call = pending.popleft()
                except IndexError:
                    with self._lock:
                        if pending:
                            continue
                        self._active.remove(worker)
                        if self._stopped:
                            return
                        self._idle.append(worker)
                    break
                if isinstance(call, Batch):
                    self._run_batch(worker, call)
                else:
                    if call.ticket.closed:  # rare: its session is ending; settle who owns it
                        with self._lock:
                            if call.dropped:
                                continue
                            call.started = _monotonic()
                    worker.current = call.ticket
                    worker.started = call.started = started = _monotonic()
                    result = run(call)
                    worker.started = 0.0
                    worker.current = None
                    if _monotonic() - started > self.slow_after:
                        call.ticket.slow = _SLOW_CREDITS
                    self._finish(result)
                if worker.detached:  # replaced in the fast lane while it was blocked
                    self._leave_detached()
                    return

    def _leave_detached(self) -> None:
        """A detached thread's call returned, freeing its place under the slow cap.
        Slow calls queued while it held that place got no worker, and nothing else
        starts one (a timed-out session's close(), queued as soon as this thread
        handed back its outcome): this thread becomes their worker."""
        with self._lock:
            self._detached -= 1
            serve = self._slow_waiting < self._slow_queued and not self._stopped
            if serve:
                self._slow_workers.append(threading.current_thread())
                self._slow_waiting += 1
        if serve:
            threading.current_thread().name = "openenv-env-slow"
            self._work_slow()

    def _run_batch(self, worker: Worker, batch: Batch) -> None:
        """Run a batch's calls until none is left (or this thread left the fast lane)."""
        batch.queued = False
        worker.batch = batch
        calls = batch.calls
        outcomes = batch.outcomes
        slow_after = self.slow_after
        now = _monotonic()
        while not worker.detached:
            try:
                index, ticket, fn, args = calls.popleft()
            except IndexError:
                break
            # The watch reads these two; between calls they keep the last call's
            # values for the moment it takes to start the next.
            worker.current = ticket
            worker.started = started = now
            # outcome(), written out: a call less a step (a tenth of this loop's cost).
            if ticket.closed:  # closed after drop_queued looked: the call never runs
                ok, value = False, NotStarted(ENDED)
            else:
                try:
                    ok, value = True, fn(*args)
                except BaseException as exc:
                    ok, value = outcome_of(exc)
            now = _monotonic()
            if now - started > slow_after:
                ticket.slow = _SLOW_CREDITS
            outcomes.append((index, ok, value))  # Batch.returned, inline
            if not batch.flagged:
                batch.flag()
        worker.started = 0.0
        worker.current = None
        worker.batch = None

    def _work_slow(self) -> None:
        get = self._slow_queue.get
        while True:
            try:
                call = get(timeout=self.idle_exit)
            except queue.Empty:
                with self._lock:
                    if self._slow_waiting > self._slow_queued:  # a spare worker: retire
                        self._slow_waiting -= 1
                        self._slow_workers.remove(threading.current_thread())
                        return
                continue
            with self._lock:
                self._slow_waiting -= 1
                dropped = call is not None and call.dropped
                if call is not None and not dropped:
                    self._slow_queued -= 1
                    self._slow_calls.discard(call)
                    call.started = _monotonic()
            if call is None:
                return
            if dropped:  # its receiver already has NotStarted
                with self._lock:
                    self._slow_waiting += 1
                continue
            started = call.started
            result = run(call)
            # Credits follow the call's own length, even if nobody awaits it.
            if _monotonic() - started > self.slow_after:
                call.ticket.slow = _SLOW_CREDITS
            else:
                call.ticket.slow = max(0, call.ticket.slow - 1)
            self._finish(result)
            with self._lock:
                self._slow_waiting += 1

    def _finish(self, result: tuple[Call, bool, Any]) -> None:
        """Queue a call's outcome for its loop; wake that loop once per batch."""
        home = result[0].home
        home.done.append(result)
        home.notify()
