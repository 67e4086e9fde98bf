"""Hand tasks to workers as they free up, and keep exactly one result per task.

The driver side of every remote engine (local processes, Ray, Spark). A
``Dispatcher`` holds the tasks not yet handed out; each worker runs a few
slots, and each slot takes the next task when its previous one is done, so a
slow task or a slow worker holds up only itself. A result is kept only if
it is the task's first: a task whose result is in is never handed out again.
A task whose worker is lost while playing it goes back in the queue, for a
healthy worker, and that attempt counts against the run's ``retries``.

``serve`` runs the workers: it starts them, feeds their slots, replaces a
worker that dies while work remains, and gives up on workers that keep dying
without finishing anything. A replacement still starting when the last
result comes in is called off: on a cluster that lost a node, it may never
find room, and the run must not wait for it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Protocol

from openenv.errors import EngineError
from openenv.runtime.base import BatchSettings, ResultCallback, failed_result
from openenv.runtime.episode import time_limit, timeout_error
from openenv.runtime.shipping import Parcel, decode_result
from openenv.runtime.task import Task, TaskResult, TaskStatus

__all__ = ["Dispatcher", "RemoteWorker", "WorkerLost", "serve"]

# How long past a task's timeout the driver waits for its worker to say so,
# before it reports the timeout itself (the worker's loop may be stalled).
# The timeout counts from the handout, or from when the worker says the
# episode started: a fresh process, or an agent's module slow to import,
# starts the worker's own clock seconds after the handout.
OVERDUE_GRACE = 0.5

# Workers started in a row that died without a single result: then give up.
_MAX_FRUITLESS_STARTS = 3


class WorkerLost(EngineError):
    """A worker died, or could not be reached, holding a parcel.

    ``sent``: the parcel reached the worker (its episode may have started).
    """

    def __init__(self, reason: str, *, sent: bool) -> None:
        super().__init__(reason)
        self.sent = sent


class RemoteWorker(Protocol):
    """One worker, as ``serve`` drives it."""

    died: asyncio.Event

    async def play(self, parcel: Parcel, started: Callable[[], None]) -> bytes:
        """Play a parcel; its encoded result. Raises ``WorkerLost``.

        ``started`` is called when the worker starts the episode's clock
        (tasks with a timeout only).
        """
        ...

    async def finish(self) -> None:
        """The run is over: release what it held (never raises)."""
        ...

    def abort(self) -> None:
        """Stop the worker now: a task on it is overdue, so its loop is stalled."""
        ...

    def rest(self) -> None:
        """Nothing is left for the worker for now: close its idle sessions (never raises).

        They hold server slots that another worker's episodes may be waiting for.
        """
        ...


class Dispatcher:
    """The queue of tasks, and their results, for one run."""

    def __init__(
        self,
        tasks: Sequence[Task],
        blobs: Sequence[bytes],
        settings: BatchSettings,
        on_result: ResultCallback,
    ) -> None:
        self.tasks = tasks
        self.settings = settings
        self.results: list[TaskResult | None] = [None] * len(tasks)
        self.finished = 0
        self.on_overdue: Callable[[int], None] | None = None
        self._blobs = blobs
        self._on_result = on_result
        self._lost = [0] * len(tasks)  # attempts spent on workers that were lost
        self._free = [0] * len(tasks)  # of those, lost at no cost to the task's retries
        self._first: list[tuple[float, float] | None] = [None] * len(tasks)  # monotonic, wall
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._last_chances: dict[int, object] = {}  # task on its last chance -> its worker
        sequence = settings.sequence_dependent
        self._ready: deque[int] = deque([0] if sequence else range(len(tasks)))
        self._wake = asyncio.Event()
        self.done = asyncio.Event()  # set with the last result

    @property
    def complete(self) -> bool:
        return self.finished == len(self.tasks)

    @property
    def starved(self) -> bool:
        """No task is waiting to be handed out."""
        return not self._ready

    def poke(self) -> None:
        """Wake every slot waiting in ``take`` to look again."""
        self._wake.set()

    async def take(
        self, until: asyncio.Event | None = None, worker: object = None
    ) -> Parcel | None:
        """The next task to play; ``None`` when all are done, or ``until`` is set.

        A task on its last chance (one more lost worker fails it) is not
        handed to a ``worker`` that plays another one: the tasks lost together
        with one that kills its worker would otherwise be handed out together
        again, and die with it again, until their retries ran out too.
        """
        while True:
            if until is not None and until.is_set():
                return None
            crowded = worker is not None and worker in self._last_chances.values()
            while (index := self._next(crowded)) is not None:
                parcel = self._parcel(index)
                if parcel is not None:
                    if worker is not None and self._last_chance(index):
                        self._last_chances[index] = worker
                    return parcel
            if self.complete:
                return None
            self._wake.clear()
            await self._wake.wait()

    def _next(self, crowded: bool) -> int | None:
        """The first ready task that may go to a worker (``crowded``: it plays a last chance)."""
        if not crowded:
            return self._ready.popleft() if self._ready else None
        for position, index in enumerate(self._ready):
            if not self._last_chance(index) or self.results[index] is not None:
                del self._ready[position]
                return index
        return None

    def _last_chance(self, index: int) -> bool:
        lost = self._lost[index]
        return lost > 0 and lost - self._free[index] >= self.settings.retries

    def _parcel(self, index: int) -> Parcel | None:
        if self.results[index] is not None:
            return None
        task = self.tasks[index]
        now = time.monotonic()
        if self._first[index] is None:
            self._first[index] = (now, time.time())
        limit = time_limit(task, self.settings)
        time_left = None
        if limit is not None:
            time_left = limit - (now - self._first[index][0])  # type: ignore[index]
            if time_left <= 0:
                self._record(index, self._timeout(index))
                return None
            self._watch(index, time_left)
        previous = None
        if self.settings.sequence_dependent and index > 0:
            previous = self.results[index - 1]
        return Parcel(
            index=index,
            task_id=task.id,
            blob=self._blobs[index],
            attempts_before=self._lost[index],
            free_attempts=self._free[index],
            time_left=time_left,
            previous=previous,
        )

    def started(self, parcel: Parcel) -> None:
        """The worker started ``parcel``'s episode: its timeout runs from now there."""
        if parcel.index in self._timers and parcel.time_left is not None:
            self._cancel_timer(parcel.index)
            self._watch(parcel.index, parcel.time_left)

    def _watch(self, index: int, time_left: float) -> None:
        loop = asyncio.get_running_loop()
        self._timers[index] = loop.call_later(time_left + OVERDUE_GRACE, self._overdue, index)

    def finish(self, data: bytes) -> None:
        """A worker's encoded result; kept unless the task has one already."""
        index, result = decode_result(data)
        self._record(index, result)

    def put_back(self, parcel: Parcel) -> None:
        """A parcel that never reached its worker: hand it out again, at no cost."""
        self._cancel_timer(parcel.index)
        self._last_chances.pop(parcel.index, None)
        self._ready.appendleft(parcel.index)
        self._wake.set()

    def lost(self, parcel: Parcel, reason: str, *, charged: bool = True) -> None:
        """The worker playing ``parcel`` is gone: hand it out again, or give up on it.

        ``charged``: the loss counts against the task's retries. It does not when
        the driver stopped the worker for another task's sake (a stalled loop):
        the attempt still shows in ``attempts``.
        """
        index = parcel.index
        self._cancel_timer(index)
        self._last_chances.pop(index, None)
        if self.results[index] is not None:
            return
        self._lost[index] = parcel.attempts_before + 1
        self._free[index] = parcel.free_attempts + (not charged)
        if charged and self._lost[index] - self._free[index] > self.settings.retries:
            message = (
                f"{reason}; the task lost its worker {self._lost[index]} times "
                f"(retries={self.settings.retries})"
            )
            self._record(index, self._failed(index, message))
            return
        self._ready.appendleft(index)
        self._wake.set()

    def abandon(self, reason: str) -> None:
        """No worker is left: every task without a result fails with ``reason``."""
        for index, result in enumerate(self.results):
            if result is None:
                self._record(index, self._failed(index, reason))

    def _record(self, index: int, result: TaskResult) -> None:
        self._cancel_timer(index)
        self._last_chances.pop(index, None)
        if self.results[index] is not None:
            return  # exactly one result per task: the first
        self.results[index] = result
        self.finished += 1
        if self.complete:
            self.done.set()
        self._on_result(index, result)
        if self.settings.sequence_dependent and index + 1 < len(self.tasks):
            self._ready.append(index + 1)
        self._wake.set()

    def _failed(self, index: int, message: str) -> TaskResult:
        first = self._first[index]
        started = first[1] if first else time.time()
        result = failed_result(self.tasks[index].id, "WorkerError", message, started)
        return replace(result, attempts=max(self._lost[index], 1))

    def _timeout(self, index: int) -> TaskResult:
        first = self._first[index]
        task = self.tasks[index]
        return TaskResult(
            task_id=task.id,
            status=TaskStatus.TIMEOUT,
            error=timeout_error(task, time_limit(task, self.settings)),
            started_at=first[1] if first else time.time(),
            ended_at=time.time(),
            attempts=self._lost[index] + 1,
        )

    def _overdue(self, index: int) -> None:
        self._timers.pop(index, None)
        if self.results[index] is None:
            self._record(index, self._timeout(index))
            if self.on_overdue is not None:
                self.on_overdue(index)

    def _cancel_timer(self, index: int) -> None:
        handle = self._timers.pop(index, None)
        if handle is not None:
            handle.cancel()


async def serve(
    dispatcher: Dispatcher,
    start: Callable[[], Awaitable[RemoteWorker]],
    workers: int,
    slots: int,
) -> None:
    """Run ``workers`` workers of ``slots`` slots each until every task has its result."""
    # No worker plays more episodes at once than there are tasks: a huge
    # max_concurrency (a run "without a bound") made a coroutine per slot, and
    # two tasks took a minute and gigabytes.
    slots = min(slots, len(dispatcher.tasks))
    reasons: list[str] = []
    holders: dict[int, RemoteWorker] = {}
    stopped: set[int] = set()  # id() of workers stopped for another task's stalled loop

    def overdue(index: int) -> None:
        # The worker did not report its own timeout: something blocks its loop
        # (an agent calling time.sleep in `async def`), and every other episode
        # on it waits too. Stop it; those episodes go to healthy workers, at no
        # cost to their retries.
        worker = holders.get(index)
        if worker is not None:
            stopped.add(id(worker))
            worker.abort()

    dispatcher.on_overdue = overdue

    async def supervise() -> None:
        fruitless = 0
        while not dispatcher.complete:
            before = dispatcher.finished
            try:
                worker = await _start_unless_done(start, dispatcher)
                if worker is None:
                    return
            except Exception as exc:
                reasons.append(f"a worker could not be started: {type(exc).__name__}: {exc}")
                fruitless += 1
            else:
                watch = asyncio.create_task(_poke_on_death(worker, dispatcher))
                try:
                    await asyncio.gather(
                        *(_slot(worker, dispatcher, holders, stopped) for _ in range(slots))
                    )
                except asyncio.CancelledError:
                    worker.abort()  # the run was cancelled: stop its episodes too
                    raise
                finally:
                    watch.cancel()
                    stopped.discard(id(worker))
                if not worker.died.is_set():
                    await worker.finish()
                    return
                fruitless = fruitless + 1 if dispatcher.finished == before else 0
                reasons.append("the worker died")
            if fruitless >= _MAX_FRUITLESS_STARTS:
                return

    await asyncio.gather(*(supervise() for _ in range(workers)))
    if not dispatcher.complete:
        dispatcher.abandon(reasons[-1] if reasons else "no worker was left to run it")


async def _start_unless_done(
    start: Callable[[], Awaitable[RemoteWorker]], dispatcher: Dispatcher
) -> RemoteWorker | None:
    """A started worker, or ``None`` when every task got its result first.

    The start is cancelled then, or past the run's ``start_timeout`` (a
    ``TimeoutError``); each engine's ``start`` gives back what it was
    acquiring (a pending Ray actor, a queued Spark job) when cancelled.
    """
    limit = dispatcher.settings.start_timeout
    starting = asyncio.ensure_future(start())
    done = asyncio.ensure_future(dispatcher.done.wait())
    try:
        await asyncio.wait({starting, done}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        starting.cancel()  # the run itself was cancelled
        raise
    finally:
        done.cancel()
    late = not starting.done() and not dispatcher.complete
    if not starting.done():
        starting.cancel()
        await asyncio.wait({starting})
    if starting.cancelled():
        if late:
            raise TimeoutError(f"no worker started within start_timeout ({limit:g}s)")
        return None
    worker = starting.result()  # a failure to start raises, for supervise to count
    if dispatcher.complete:
        await worker.finish()  # started just as the run ended: kept for the next run
        return None
    return worker


async def _poke_on_death(worker: RemoteWorker, dispatcher: Dispatcher) -> None:
    await worker.died.wait()
    dispatcher.poke()


async def _slot(
    worker: RemoteWorker,
    dispatcher: Dispatcher,
    holders: dict[int, RemoteWorker],
    stopped: set[int],
) -> None:
    while (parcel := await dispatcher.take(until=worker.died, worker=worker)) is not None:
        holders[parcel.index] = worker
        try:
            data = await worker.play(parcel, functools.partial(dispatcher.started, parcel))
        except WorkerLost as exc:
            worker.died.set()
            if exc.sent:
                dispatcher.lost(parcel, str(exc), charged=id(worker) not in stopped)
            else:
                dispatcher.put_back(parcel)
            return
        finally:
            holders.pop(parcel.index, None)
        dispatcher.finish(data)
        if dispatcher.starved and worker not in holders.values():
            worker.rest()
