"""``async def`` steps started from the protocol's callback, each in a task of its own.

``Session.try_step`` gives such a step a task that runs in the session's own
context (eagerly where asyncio has eager tasks), and the step replies from
it. To the step this must look like being awaited by the session's task:
one current task all the way through a step, one context per session kept
from step to step, ``asyncio.timeout`` working, and a cancellation of the
session's task (a shutdown, a stalled client) reaching the step.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from typing import Any

import orjson
import pytest
from servers import Ping, PingEnvironment, Pong, Tracker, health, slots_free, until
from test_direct_steps import count_handle, exchange, session_socket
from websockets.exceptions import ConnectionClosed

from openenv import ConcurrencyConfig, create_app
from openenv.testing import run_server

# What a step saw of the context it ran in: set by the step before it returns.
last_message: contextvars.ContextVar[str] = contextvars.ContextVar("last_message", default="")


class Awaiting(PingEnvironment):
    """An ``async def`` step that suspends or not, as its action's message says,
    and writes down the task and context each part of it ran in."""

    def __init__(
        self, tracker: Tracker, seen: list[dict[str, Any]], gate: threading.Event | None = None
    ) -> None:
        super().__init__(tracker)
        self.seen = seen
        self.gate = gate

    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        kind = action.message
        before = asyncio.current_task()
        previous = last_message.get()
        last_message.set(kind)
        record: dict[str, Any] = {"kind": kind, "previous": previous, "before": before}
        self.seen.append(record)
        if kind == "yield":
            await asyncio.sleep(0)
        elif kind == "hold":
            assert self.gate is not None
            loop = asyncio.get_running_loop()
            record["waiting"] = True
            try:
                await loop.run_in_executor(None, self.gate.wait, 30)
            except asyncio.CancelledError:
                record["cancelled"] = True
                raise
        elif kind == "timeout":
            # A deadline already passed: it cancels the step's own task, and
            # asyncio.timeout turns that into TimeoutError inside the step.
            try:
                async with asyncio.timeout(0):
                    await asyncio.sleep(30)
            except TimeoutError:
                kind = "timed out"
        elif kind == "raise later":
            await asyncio.sleep(0)
            raise ValueError("failed after a suspension")
        record["after"] = asyncio.current_task()
        record["context value"] = last_message.get()
        return super().step(action.model_copy(update={"message": kind}))


@pytest.fixture(autouse=True, params=["as shipped", "a task per step"])
def step_tasks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: as this Python runs async steps, and in a task of their
    own per step (what Python 3.12 and later do, with eager tasks; on 3.11 the
    same code, with tasks that start on the next loop round)."""
    if request.param == "as shipped":
        return
    from openenv.server import direct_steps

    def task_per_step(
        loop: asyncio.AbstractEventLoop, coro: Any, *, context: contextvars.Context | None
    ) -> asyncio.Task[Any]:
        factory = getattr(asyncio, "eager_task_factory", None)
        if factory is not None:
            task: asyncio.Task[Any] = factory(loop, coro, context=context)
            return task
        return loop.create_task(coro, context=context)

    monkeypatch.setattr(direct_steps, "_eager_task_factory", task_per_step)


def awaiting_app(
    seen: list[dict[str, Any]], gate: threading.Event | None = None
) -> tuple[Any, Tracker]:
    tracker = Tracker()
    factory = functools.partial(Awaiting, tracker, seen, gate)
    return create_app(factory, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=2)), tracker


def step(message: str, request_id: int | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "step", "data": {"message": message}}
    if request_id is not None:
        frame["id"] = request_id
    return frame


async def test_each_step_runs_in_one_task_and_in_the_sessions_own_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handled = count_handle(monkeypatch)
    seen: list[dict[str, Any]] = []
    app, tracker = awaiting_app(seen)
    kinds = ["plain", "yield", "plain", "yield", "yield", "plain"]
    with run_server(app) as url:
        async with session_socket(url) as first, session_socket(url) as second:
            await exchange(first, {"type": "reset"})
            await exchange(second, {"type": "reset"})
            for i, kind in enumerate(kinds):
                reply = await exchange(first, step(kind, i))
                assert reply["id"] == i
                assert reply["data"]["observation"] == {"message": kind, "count": i + 1}
            await exchange(second, step("plain"))
        await tracker.until_closed(2)
    assert len(handled) == 2  # the resets: no step went through handle()
    first_steps, (other,) = seen[: len(kinds)], seen[len(kinds) :]
    for record in seen:  # one current task through each step, suspended or not
        assert record["before"] is not None
        assert record["before"] is record["after"]
    # One context per session, kept from step to step, as the session's task keeps it.
    assert [r["previous"] for r in first_steps] == ["", *kinds[:-1]]
    assert [r["context value"] for r in first_steps] == kinds
    assert other["previous"] == ""


async def test_pipelined_steps_that_suspend_keep_their_order() -> None:
    seen: list[dict[str, Any]] = []
    app, tracker = awaiting_app(seen)
    frames = [step("yield" if i % 3 == 0 else "plain", i) for i in range(120)]
    frames[60] = {"type": "reset", "id": 60}
    with run_server(app) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            for frame in frames:
                await ws.send(orjson.dumps(frame).decode())
            replies = [orjson.loads(await ws.recv()) for _ in frames]
        await tracker.until_closed(1)
    assert [r["id"] for r in replies] == list(range(120))
    counts = [r["data"]["observation"].get("count") for r in replies]
    assert counts == [*range(1, 61), 0, *range(1, 60)]


async def test_a_deadline_inside_a_step_is_the_steps_own() -> None:
    seen: list[dict[str, Any]] = []
    app, tracker = awaiting_app(seen)
    with run_server(app) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            reply = await exchange(ws, step("timeout", 1))
            assert reply["data"]["observation"]["message"] == "timed out"
            # The cancellation was the step's own, and spent: the session goes on.
            reply = await exchange(ws, step("yield", 2))
            assert reply["data"]["observation"] == {"message": "yield", "count": 2}
        await tracker.until_closed(1)
    assert seen[0]["before"] is seen[0]["after"]


async def test_a_step_that_fails_after_suspending_gets_an_error_and_the_session_goes_on() -> None:
    seen: list[dict[str, Any]] = []
    app, tracker = awaiting_app(seen)
    with run_server(app) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            error = await exchange(ws, step("raise later", 1))
            assert error["id"] == 1
            assert error["data"]["code"] == "EXECUTION_ERROR"
            assert error["data"]["message"].startswith("step() raised ValueError (")
            reply = await exchange(ws, step("plain"))
            assert reply["data"]["observation"]["count"] == 1
        await tracker.until_closed(1)
        await slots_free(url)


async def test_close_waits_for_a_suspended_step_whose_client_vanished() -> None:
    seen: list[dict[str, Any]] = []
    gate = threading.Event()
    app, tracker = awaiting_app(seen, gate)
    with run_server(app) as url:
        ws = await session_socket(url)
        await exchange(ws, {"type": "reset"})
        await ws.send(orjson.dumps(step("hold")).decode())
        await until(lambda: _true(bool(seen) and seen[0].get("waiting", False)), what="a hold")
        ws.transport.abort()
        assert (await health(url))["active_sessions"] == 1  # the step still holds it
        assert tracker.closed == []
        gate.set()
        await tracker.until_closed(1)
        await slots_free(url)
    assert "after" in seen[0]  # it ran to its end before close()


async def test_cancelling_the_sessions_task_cancels_its_suspended_step() -> None:
    seen: list[dict[str, Any]] = []
    gate = threading.Event()
    app, tracker = awaiting_app(seen, gate)
    try:
        with run_server(app) as url:
            async with session_socket(url) as ws:
                await exchange(ws, {"type": "reset"})
                await ws.send(orjson.dumps(step("hold")).decode())
                await until(
                    lambda: _true(bool(seen) and seen[0].get("waiting", False)), what="a hold"
                )
                (connection,) = app.state.openenv.connections
                task = connection._task
                task.get_loop().call_soon_threadsafe(task.cancel)
                with pytest.raises(ConnectionClosed):
                    await ws.recv()  # no reply: the session ends
            await tracker.until_closed(1)
            await slots_free(url)
            assert (await health(url))["status"] == "healthy"
            gate.set()  # the executor's thread, which nothing can cancel
    finally:
        gate.set()
    assert seen[0].get("cancelled") is True
    assert "after" not in seen[0]


async def _true(value: bool) -> bool:
    return value


async def test_without_eager_tasks_or_a_tested_task_switch_async_steps_take_the_task_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a Python with neither gets (no eager tasks, and not a CPython whose
    # asyncio internals were tested): every async step is served by the
    # session's task (handle()), with the same replies, one task per step and
    # one context per session.
    from openenv.server import direct_steps

    monkeypatch.setattr(direct_steps, "_eager_task_factory", None)
    monkeypatch.setattr(direct_steps, "_enter", None)
    monkeypatch.setattr(direct_steps, "_leave", None)
    handled = count_handle(monkeypatch)
    seen: list[dict[str, Any]] = []
    app, tracker = awaiting_app(seen)
    kinds = ["plain", "yield", "plain", "yield"]
    with run_server(app) as url:
        async with session_socket(url) as ws:
            await exchange(ws, {"type": "reset"})
            for i, kind in enumerate(kinds):
                reply = await exchange(ws, step(kind, i))
                assert reply["id"] == i
                assert reply["data"]["observation"] == {"message": kind, "count": i + 1}
        await tracker.until_closed(1)
    assert len(handled) == 1 + len(kinds)  # the reset and every step went through handle()
    assert all(r["before"] is r["after"] for r in seen)
    assert [r["previous"] for r in seen] == ["", *kinds[:-1]]
