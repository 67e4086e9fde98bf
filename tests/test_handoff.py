"""The fast-lane hand-over of plain ``def`` calls: results, errors, blocking calls, threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import pytest

from openenv.server.handoff import Handoff, LaneTicket, NotStarted, SubmittedCall


@pytest.fixture
async def handoff() -> AsyncIterator[Handoff]:
    lane = Handoff(max_threads=4, blocking_after=0.002, slow_after=0.01)
    yield lane
    lane.shutdown()


async def test_results_and_errors_come_back_to_their_caller(handoff: Handoff) -> None:
    def fail() -> None:
        raise ValueError("boom")

    def stop() -> None:
        raise StopIteration

    tickets = [LaneTicket() for _ in range(50)]
    results = await asyncio.gather(*(handoff.call(t, pow, i, 2) for i, t in enumerate(tickets)))
    assert results == [i * i for i in range(50)]
    with pytest.raises(ValueError, match="boom"):
        await handoff.call(LaneTicket(), fail)
    with pytest.raises(RuntimeError, match="StopIteration"):
        await handoff.call(LaneTicket(), stop)
    assert await handoff.call(LaneTicket(), lambda x=1, *, y: x + y, y=2) == 3


async def test_cheap_calls_share_a_worker_not_a_thread_each(handoff: Handoff) -> None:
    await asyncio.gather(*(handoff.call(LaneTicket(), abs, -i) for i in range(2000)))
    assert handoff.threads <= 4


async def test_a_blocking_call_does_not_hold_up_others(handoff: Handoff) -> None:
    gate = threading.Event()
    slow = LaneTicket()
    blocked = asyncio.ensure_future(handoff.call(slow, gate.wait, 30))
    # Queued behind the blocked call, these still finish: the watch wakes another worker.
    for i in range(20):
        assert await handoff.call(LaneTicket(), abs, -i) == i
    assert not blocked.done()
    gate.set()
    assert await blocked is True
    assert slow.slow > 0  # it took longer than slow_after: its next calls go to the slow lane


async def test_threads_stay_capped_when_every_call_blocks(handoff: Handoff) -> None:
    gate = threading.Event()
    calls = [asyncio.ensure_future(handoff.call(LaneTicket(), gate.wait, 30)) for _ in range(10)]

    for _ in range(2000):  # poll, with a deadline, until the watch has woken every worker
        if handoff.threads == 4:
            break
        await asyncio.sleep(0.005)
    assert handoff.threads == 4
    assert not any(c.done() for c in calls)
    gate.set()
    assert await asyncio.gather(*calls) == [True] * 10
    assert handoff.threads == 4


async def test_a_burst_of_blocking_calls_widens_the_lane_by_doubling() -> None:
    # Many sessions arriving at once whose first calls block: a quick call
    # queued behind them waits until there is a worker for each, and the
    # watch adds one helper per stuck worker, not one per tick.
    lane = Handoff(max_threads=40, blocking_after=0.02)
    ticks = 0
    watch = lane._watch

    def counted() -> None:
        nonlocal ticks
        ticks += 1
        watch()

    lane._watch = counted  # type: ignore[method-assign]
    gate = threading.Event()
    try:
        blocked = [lane.submit(LaneTicket(), gate.wait, (30,), {}) for _ in range(32)]
        assert await lane.submit(LaneTicket(), abs, (-7,), {}) == 7
        assert lane.threads == 33
        assert not any(b.done() for b in blocked)
        # Five doublings from one worker to 32; a woken worker may count as stuck
        # a tick late. One helper per tick would take 32 ticks.
        assert ticks <= 20
    finally:
        gate.set()
        lane.shutdown()
    assert await asyncio.gather(*blocked) == [True] * 32


async def test_a_slow_ticket_returns_to_the_fast_lane_after_quick_calls(handoff: Handoff) -> None:
    ticket = LaneTicket()
    ticket.slow = 3
    for _ in range(3):
        assert await handoff.call(ticket, abs, -1) == 1
    assert ticket.slow == 0


async def test_shutdown_lets_the_workers_exit() -> None:
    before = set(threading.enumerate())
    lane = Handoff(max_threads=2)
    await asyncio.gather(*(lane.call(LaneTicket(), abs, -i) for i in range(100)))
    started = set(threading.enumerate()) - before
    assert started
    lane.shutdown()
    for thread in started:
        thread.join(10)
        assert not thread.is_alive()


async def test_slow_tickets_run_side_by_side_on_the_slow_lane(handoff: Handoff) -> None:
    # Four slow sessions, each blocked until all four are inside their calls:
    # only workers running side by side get past the barrier.
    barrier = threading.Barrier(4, timeout=10)
    tickets = [LaneTicket() for _ in range(4)]
    for ticket in tickets:
        ticket.slow = 5

    def meet() -> str:
        barrier.wait()
        return threading.current_thread().name

    names = await asyncio.gather(*(handoff.call(t, meet) for t in tickets))
    assert set(names) == {"openenv-env-slow"}
    assert handoff.slow_threads == 4
    assert handoff.threads == 0  # the fast lane never saw them

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await handoff.call(tickets[0], fail)


async def test_slow_lane_workers_exit_on_shutdown() -> None:
    before = set(threading.enumerate())
    lane = Handoff(max_threads=3)
    tickets = [LaneTicket() for _ in range(3)]
    for ticket in tickets:
        ticket.slow = 100
    assert await asyncio.gather(*(lane.call(t, abs, -i) for i, t in enumerate(tickets))) == [
        0,
        1,
        2,
    ]
    started = set(threading.enumerate()) - before
    assert {t.name for t in started} == {"openenv-env-slow"}
    lane.shutdown()
    for thread in started:
        thread.join(10)
        assert not thread.is_alive()


async def test_idle_workers_of_both_lanes_end_their_threads() -> None:
    lane = Handoff(max_threads=3, idle_exit=0.5)
    slow = LaneTicket()
    slow.slow = 100
    assert await lane.call(LaneTicket(), abs, -1) == 1
    assert await lane.call(slow, abs, -2) == 2
    assert (lane.threads, lane.slow_threads) == (1, 1)
    for _ in range(1000):  # poll, with a deadline, until both have retired
        if lane.threads == lane.slow_threads == 0:
            break
        await asyncio.sleep(0.01)
    assert (lane.threads, lane.slow_threads) == (0, 0)
    # And both lanes start threads again when work comes back.
    assert await lane.call(LaneTicket(), abs, -3) == 3
    assert await lane.call(slow, abs, -4) == 4
    lane.shutdown()


async def test_a_receiver_that_raises_does_not_lose_the_rest_of_its_batch() -> None:
    class Broken:
        def cancelled(self) -> bool:
            return False

        def set_result(self, result: object, /) -> None:
            raise RuntimeError("a receiver's bug")

        def set_exception(self, exception: BaseException, /) -> None:
            raise RuntimeError("a receiver's bug")

    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    lane = Handoff(max_threads=1)
    both_ran = threading.Event()
    try:
        after: asyncio.Future[int] = loop.create_future()
        lane.dispatch(LaneTicket(), pow, (2, 3), {}, Broken())
        lane.dispatch(LaneTicket(), lambda: both_ran.set() or 7, (), {}, after)
        await asyncio.sleep(0)  # the round ends: the worker is woken
        # Hold the loop until both calls are done, so one delivery carries both.
        assert both_ran.wait(10)
        assert await asyncio.wait_for(after, 10) == 7
        assert [str(c["exception"]) for c in reported] == ["a receiver's bug"]
    finally:
        lane.shutdown()
        loop.set_exception_handler(None)


def test_two_loops_sharing_a_handoff_each_get_their_own_results() -> None:
    # One app served by two servers at once in one process shares its handoff:
    # each loop's results must come back on that loop's thread, never the other's.
    handoff = Handoff(max_threads=4)
    go = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    async def serve(name: str) -> list[int]:
        asyncio.get_running_loop().set_debug(True)  # a cross-thread call_soon raises
        go.wait()
        ticket = LaneTicket()
        results = []
        for i in range(200):
            results += await asyncio.gather(
                *(asyncio.wait_for(handoff.call(ticket, abs, -i), 5) for _ in range(5))
            )
        return results

    def run(name: str) -> None:
        try:
            outcomes[name] = asyncio.run(serve(name))
        except BaseException as exc:  # reported below, with the thread's name
            outcomes[name] = exc

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in ("a", "b")]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        handoff.shutdown()
    expected = [i for i in range(200) for _ in range(5)]
    assert outcomes == {"a": expected, "b": expected}


async def test_blocked_threads_leave_the_fast_lane_until_both_lanes_are_full() -> None:
    lane = Handoff(max_threads=2, blocking_after=0.002, stuck_after=0.05)
    gate = threading.Event()
    try:
        blocked = [lane.submit(LaneTicket(), gate.wait, (30,), {}) for _ in range(2)]
        # Both fast threads block; a quick call still runs, on a thread that replaces them.
        assert await lane.call(LaneTicket(), abs, -7) == 7
        assert lane.starved == 0
        blocked += [lane.submit(LaneTicket(), gate.wait, (30,), {}) for _ in range(2)]
        waiting = lane.submit(LaneTicket(), abs, (-1,), {})
        # Poll, with a deadline, until the watch gives up. Two calls may wait for a while
        # first: a thread still blocked in the first pair leaves the fast lane only once
        # it is past stuck_after, and only then does the fourth blocked call get a thread.
        for _ in range(2000):
            if lane.starved == 1:
                break
            await asyncio.sleep(0.005)
        assert lane.starved == 1  # four blocked calls hold all 2 * max_threads threads
        assert not waiting.done()
        gate.set()
        assert await waiting == 1
        assert await asyncio.gather(*blocked) == [True] * 4
        assert lane.starved == 0
    finally:
        gate.set()
        lane.shutdown()


async def test_a_slow_call_queued_while_a_detached_thread_holds_the_cap_runs_once_it_ends() -> None:
    """A thread that left the fast lane counts against the slow lane's cap; a slow
    call submitted meanwhile got no worker, and when that thread's call returned
    and it ended, nothing started one: the call waited forever. (A session whose
    blocking step timed out queued its close() there, and kept its slot.)"""
    lane = Handoff(max_threads=1, blocking_after=0.002, stuck_after=0.05)
    first, second = threading.Event(), threading.Event()
    try:
        detached = lane.submit(LaneTicket(), first.wait, (30,), {})
        behind = lane.submit(LaneTicket(), second.wait, (30,), {}, timed=True)
        assert isinstance(behind, SubmittedCall)
        # The one fast thread blocks; the second call gets a thread only once the
        # first has left the fast lane (past stuck_after): then it holds the slow cap.
        for _ in range(2000):
            if behind.started() is not None:
                break
            await asyncio.sleep(0.005)
        assert behind.started() is not None
        slow = LaneTicket()
        slow.slow = 16
        queued = lane.submit(slow, abs, (-3,), {})
        assert lane.starved == 1  # no thread for it: the detached one holds the cap
        first.set()
        assert await detached is True
        # That thread's call returned: the slow lane has room, and the queued call runs.
        assert await asyncio.wait_for(queued, 10) == 3
        assert lane.starved == 0
        second.set()
        assert await behind is True
    finally:
        first.set()
        second.set()
        lane.shutdown()


async def test_dropped_calls_never_run_and_fail_at_once() -> None:
    lane = Handoff(max_threads=1, blocking_after=0.002, stuck_after=60)
    gate, ran = threading.Event(), []
    try:
        slow = LaneTicket()
        slow.slow = 16  # its calls queue on the slow lane
        running = lane.submit(slow, gate.wait, (30,), {}, timed=True)
        assert isinstance(running, SubmittedCall)
        for _ in range(2000):  # poll, with a deadline, until a slow thread runs it
            if running.started() is not None:
                break
            await asyncio.sleep(0.005)
        busy = lane.submit(LaneTicket(), gate.wait, (30,), {})
        ending = LaneTicket()
        queued = [lane.submit(ending, ran.append, ("fast",), {})]
        queued.append(lane.submit(slow, ran.append, ("slow",), {}))
        lane.drop_queued(ending)
        lane.drop_queued(slow)
        outcomes = await asyncio.gather(*queued, return_exceptions=True)
        assert [type(o) for o in outcomes] == [NotStarted, NotStarted]
        gate.set()
        assert await busy is True
        assert await running is True  # it had started: dropping left it alone
        assert await lane.call(LaneTicket(), ran.append, "after") is None
        assert ran == ["after"]
    finally:
        gate.set()
        lane.shutdown()


async def test_untimed_calls_get_asyncios_own_future() -> None:
    # A Python subclass of asyncio.Future makes every await on it take the
    # task's slow path; only callers with a deadline need to know when a
    # thread began the call.
    lane = Handoff(max_threads=1)
    try:
        plain = lane.submit(LaneTicket(), sum, ([1, 2],), {})
        timed = lane.submit(LaneTicket(), sum, ([3, 4],), {}, timed=True)
        assert type(plain) is type(asyncio.get_running_loop().create_future())
        assert isinstance(timed, SubmittedCall)
        assert (await plain, await timed) == (3, 7)
        assert timed.started() is not None
    finally:
        lane.shutdown()


class Outcomes:
    """A ``BatchReceiver`` that keeps every outcome, and fails on one delivered twice."""

    def __init__(self) -> None:
        self.got: dict[int, tuple[bool, object]] = {}
        self.deliveries = 0

    def batch_outcomes(self, outcomes: list[tuple[int, bool, object]], /) -> None:
        self.deliveries += 1
        for index, ok, value in outcomes:
            assert index not in self.got, f"outcome {index} delivered twice"
            self.got[index] = (ok, value)

    async def wait_for(self, count: int) -> None:
        for _ in range(2000):  # poll, with a deadline, until ``count`` are in
            if len(self.got) >= count:
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"only {sorted(self.got)} of {count} outcomes came back")


async def test_a_batch_runs_every_call_and_reports_each_outcome_once(handoff: Handoff) -> None:
    def fail() -> None:
        raise ValueError("boom")

    def stop() -> None:
        raise StopIteration

    calls = [(LaneTicket(), pow, (i, 2)) for i in range(100)]
    calls[10] = (LaneTicket(), fail, ())
    calls[20] = (LaneTicket(), stop, ())
    outcomes = Outcomes()
    handoff.dispatch_batch(calls, outcomes)
    await outcomes.wait_for(len(calls))
    assert {i: v for i, (ok, v) in outcomes.got.items() if ok} == {
        i: i * i for i in range(100) if i not in (10, 20)
    }
    assert repr(outcomes.got[10][1]) == "ValueError('boom')"
    assert isinstance(outcomes.got[20][1], RuntimeError)
    assert outcomes.deliveries < len(calls)  # outcomes that came back together, together
    assert handoff.threads <= 4


async def test_a_blocking_call_in_a_batch_holds_back_only_itself(handoff: Handoff) -> None:
    gate = threading.Event()
    slow = LaneTicket()
    calls = [(slow, gate.wait, (30,))] + [(LaneTicket(), abs, (-i,)) for i in range(1, 20)]
    outcomes = Outcomes()
    try:
        handoff.dispatch_batch(calls, outcomes)
        # The thread running the batch blocks in its first call; the watch hands
        # the rest of the batch to another thread.
        await outcomes.wait_for(19)
        assert outcomes.got == {i: (True, i) for i in range(1, 20)}
    finally:
        gate.set()
    await outcomes.wait_for(20)
    assert outcomes.got[0] == (True, True)


async def test_a_call_of_a_batch_that_took_long_moves_its_ticket_to_the_slow_lane() -> None:
    # A threshold far above what a busy machine's preemption could add to abs().
    lane = Handoff(max_threads=2, slow_after=0.2)
    slow, quick = LaneTicket(), LaneTicket()
    outcomes = Outcomes()
    try:
        lane.dispatch_batch([(slow, time.sleep, (0.25,)), (quick, abs, (-1,))], outcomes)
        await outcomes.wait_for(2)
    finally:
        lane.shutdown()
    assert (slow.slow, quick.slow) == (16, 0)  # longer than slow_after, or not


async def test_a_slow_ticket_in_a_batch_runs_on_the_slow_lane(handoff: Handoff) -> None:
    slow = LaneTicket()
    slow.slow = 16
    calls = [
        (slow, lambda: threading.current_thread().name, ()),
        (LaneTicket(), lambda: threading.current_thread().name, ()),
    ]
    outcomes = Outcomes()
    handoff.dispatch_batch(calls, outcomes)
    await outcomes.wait_for(2)
    assert outcomes.got == {0: (True, "openenv-env-slow"), 1: (True, "openenv-env-fast")}


async def test_dropped_calls_of_a_batch_never_run_and_fail_at_once() -> None:
    lane = Handoff(max_threads=1, blocking_after=0.002, stuck_after=60)
    gate, ran = threading.Event(), []
    try:
        busy = lane.submit(LaneTicket(), gate.wait, (30,), {})  # the one fast thread
        ending, staying = LaneTicket(), LaneTicket()
        outcomes = Outcomes()
        lane.dispatch_batch(
            [(ending, ran.append, ("ending",)), (staying, ran.append, ("staying",))], outcomes
        )
        lane.drop_queued(ending)
        await outcomes.wait_for(1)
        assert list(outcomes.got) == [0]
        assert isinstance(outcomes.got[0][1], NotStarted)
        gate.set()
        assert await busy is True
        await outcomes.wait_for(2)
        assert outcomes.got[1] == (True, None)
        assert ran == ["staying"]
    finally:
        gate.set()
        lane.shutdown()


async def test_a_receiver_that_raises_does_not_stop_later_batches() -> None:
    class Broken:
        def batch_outcomes(self, outcomes: list[tuple[int, bool, object]], /) -> None:
            raise RuntimeError("a receiver's bug")

    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    lane = Handoff(max_threads=1)
    try:
        lane.dispatch_batch([(LaneTicket(), abs, (-1,))], Broken())
        after = Outcomes()
        lane.dispatch_batch([(LaneTicket(), abs, (-2,))], after)
        await after.wait_for(1)
        assert after.got == {0: (True, 2)}
        assert [str(c["exception"]) for c in reported] == ["a receiver's bug"]
    finally:
        lane.shutdown()
        loop.set_exception_handler(None)
