"""Steps started from the protocol's callback, without waking the session's task.

A session whose endpoint has a direct channel (``server/direct.py``) offers
each incoming frame to ``try_step`` first: a well-formed step of a plain
``def`` goes straight to its lane, and an ``async def`` step runs right there,
as a part of the session's task, until it returns or first suspends (what an
eager task does on Python 3.12, inside a task that already exists). Anything
else is left to ``Session.handle``, which answers it in full.

Running a coroutine as a part of an existing task takes
``asyncio.tasks._enter_task``/``_leave_task``, which no public interface
offers (an eager task is a new task per step, the cost this path saves). So
they are used only on the CPython releases this was tested with
(``TESTED_PYTHONS``); on any other, ``async def`` steps take the task path,
as they do under uvicorn's own protocols: correct, and about 15% more CPU per
step.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import sys
import time
import types
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

from openenv import protocol
from openenv.environment import Environment
from openenv.protocol import CloseCode, FrameError
from openenv.server.session_core import Call
from openenv.server.session_host import SessionLog, SessionState
from openenv.types import Observation

__all__ = ["DirectStep", "DirectStepping"]


class DirectStepping:
    """The part of ``Session`` that starts steps from a callback; ``Session`` provides the rest."""

    env: Environment[Any, Any, Any]
    state: SessionState
    busy: bool
    last_active: float
    direct_steps: bool
    _async_step: bool
    _dispatch_step: Callable[..., None]
    _direct_step: DirectStep | None
    _suspended: tuple[Coroutine[Any, Any, Any], Any] | None
    _settled: asyncio.Future[None] | None

    if TYPE_CHECKING:  # what the session core (server/session_core.py) provides

        @property
        def log(self) -> SessionLog: ...
        def _end(self, close_code: CloseCode) -> None: ...
        def step_call(self, data: Any, request_id: protocol.RequestId | None) -> Call: ...
        def finish(self, call: Call, ok: bool, value: Any) -> str: ...
        def internal_error(self, exc: BaseException, request_id: Any) -> str: ...

    def try_step(
        self,
        frame: str | bytes,
        reply: Callable[[str], None],
        task: asyncio.Task[Any] | None = None,
        context: contextvars.Context | None = None,
    ) -> bool:
        """Start a well-formed step from a callback, without waking a task.

        A plain ``def`` step goes to its lane. An ``async def`` step runs here,
        as a part of ``task`` (the session's task, whose ``context`` it runs in),
        until it returns or first suspends; then ``suspended`` is true and the
        session's task must finish it with ``settled()``. ``reply`` gets the
        reply frame on the loop thread once the step returns; until then
        ``busy`` is true. ``False`` (anything else: other messages, bad frames,
        a step already running) leaves the frame to ``handle``, which answers it
        in full.
        """
        if not self.direct_steps or self.busy or self.state is not SessionState.OPEN:
            return False
        try:
            request = protocol.decode_frame(frame)
        except FrameError:
            return False
        return self.try_step_request(request, reply, task, context)

    def try_step_request(
        self,
        request: dict[str, Any],
        reply: Callable[[str], None],
        task: asyncio.Task[Any] | None = None,
        context: contextvars.Context | None = None,
    ) -> bool:
        """``try_step`` for a request already decoded (one of a v2 frame's)."""
        if not self.direct_steps or self.busy or self.state is not SessionState.OPEN:
            return False
        try:
            step = protocol.plain_step(request)
            if step is None:
                return False
            call = self.step_call(*step)
        except Exception:  # handle() plans it again and answers (or fails) in full
            return False
        receiver = DirectStep(self, call, reply)
        # Busy from here, as in handle(); _stepped clears both once it replies,
        # which an async def step that never suspends does before this returns.
        self.busy = True
        self._direct_step = receiver
        if not self._async_step:
            self._dispatch_step(call.args, {}, receiver)  # its outcome comes in a later callback
        elif not self._start_async(receiver, call.args[0], task, context):
            self.busy = False
            self._direct_step = None
            return False
        return True

    def _start_async(
        self,
        step: DirectStep,
        action: Any,
        task: asyncio.Task[Any] | None,
        context: contextvars.Context | None,
    ) -> bool:
        """Run an ``async def`` step as a part of ``task``, until it returns or first
        suspends; ``False`` if it cannot start here (nothing has run).

        What an eager task does (Python 3.12), inside a task that already exists:
        ``asyncio.current_task()`` is ``task``, so ``asyncio.timeout`` and task
        groups work, and the rest runs in that same task (``settled``).
        """
        if task is None or context is None or _enter_task is None or _leave_task is None:
            return False  # no task given, or an asyncio without these: the task runs it
        loop = task.get_loop()
        try:
            _enter_task(loop, task)
        except RuntimeError:  # another task is running: not a protocol callback
            return False
        try:
            coro = self.env.step(action)
            if not isinstance(coro, types.CoroutineType):
                ok, value = True, coro  # an awaitable that is no coroutine: _stepped awaits it
            else:
                try:
                    awaiting = context.run(coro.send, None)
                except StopIteration as done:
                    ok, value = True, done.value
                except BaseException as exc:
                    ok, value = False, exc
                else:
                    self._suspended = (coro, awaiting)
                    return True
        finally:
            _leave_task(loop, task)
        self._stepped(step, ok, value)
        return True

    @property
    def suspended(self) -> bool:
        """Whether an ``async def`` step ``try_step`` started waits for ``settled()``."""
        return self._suspended is not None

    async def settled(self, error: BaseException | None = None) -> None:
        """Wait until the step ``try_step`` started has replied.

        An ``async def`` step that suspended there goes on here, in the
        session's task, with ``error`` (a cancellation of that task) thrown in.
        """
        suspended, self._suspended = self._suspended, None
        if suspended is not None and self._direct_step is not None:
            coro, awaiting = suspended
            step = self._direct_step
            step.resumed = True
            await await_step(step, resume(coro, awaiting, error))
        while self._direct_step is not None:
            if self._settled is None:
                self._settled = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._settled)

    def _stepped(self, step: DirectStep, ok: bool, value: Any) -> None:
        """A ``try_step`` step returned (or raised): reply, as ``handle`` would have."""
        awaitable = not isinstance(value, Observation) and inspect.isawaitable(value)
        if ok and awaitable and not step.awaited:
            # A plain def that returned an awaitable: finish it in a task.
            step.task = asyncio.ensure_future(await_step(step, value))
            return
        reply: str | None = None
        try:
            if not ok and step.resumed and isinstance(value, asyncio.CancelledError):
                # The session's own task is cancelled (a shutdown): it ends
                # the session as it unwinds, and nobody waits for a reply.
                self._end(CloseCode.GOING_AWAY)
            elif not ok and not isinstance(value, Exception):
                raise value  # KeyboardInterrupt and the like: not the env's failure
            else:
                reply = self.finish(step.call, ok, value)
        except BaseException as exc:
            # What would have reached handle()'s last resort.
            reply = self.internal_error(exc, step.call.request_id)
        self.busy = False
        self.last_active = time.monotonic()
        self._direct_step = None
        settled, self._settled = self._settled, None
        if settled is not None and not settled.done():
            settled.set_result(None)
        if reply is not None:
            step.reply(reply)


class DirectStep:
    """A step started by ``Session.try_step``: the lane's receiver of its outcome."""

    __slots__ = ("awaited", "call", "reply", "resumed", "session", "task")

    def __init__(self, session: DirectStepping, call: Call, reply: Callable[[str], None]) -> None:
        self.session = session
        self.call = call
        self.reply = reply
        self.awaited = False  # a plain def returned an awaitable, now awaited
        self.resumed = False  # an async def step that suspended, now in the session's task
        self.task: asyncio.Future[None] | None = None  # the task awaiting it

    def cancelled(self) -> bool:
        return False  # nobody can give up on it: the session waits for its reply

    def set_result(self, result: Any, /) -> None:
        self.session._stepped(self, True, result)

    def set_exception(self, exception: BaseException, /) -> None:
        self.session._stepped(self, False, exception)


async def await_step(step: DirectStep, awaitable: Any) -> None:
    step.awaited = True
    try:
        result = await awaitable
    except BaseException as exc:
        step.set_exception(exc)  # the session must hear of it, even of a cancellation
        if not isinstance(exc, Exception):
            raise
    else:
        step.set_result(result)


# The CPython releases whose asyncio's ``_enter_task``/``_leave_task`` this was
# tested with (the suite's direct-step tests, on each).
TESTED_PYTHONS = ((3, 11), (3, 12), (3, 13))


def _task_switch(
    implementation: str = sys.implementation.name,
    release: tuple[int, ...] = sys.version_info[:2],
) -> tuple[Any, Any]:
    """asyncio's ``_enter_task`` and ``_leave_task`` where they were tested, else two ``None``.

    >>> _task_switch("cpython", (3, 99))
    (None, None)
    >>> _task_switch("pypy", (3, 11))
    (None, None)
    """
    if implementation != "cpython" or tuple(release) not in TESTED_PYTHONS:
        return None, None
    return getattr(asyncio.tasks, "_enter_task", None), getattr(asyncio.tasks, "_leave_task", None)


_enter_task, _leave_task = _task_switch()


@types.coroutine
def resume(
    coro: Coroutine[Any, Any, Any], awaiting: Any, error: BaseException | None
) -> Generator[Any, Any, Any]:
    """Go on with ``coro`` in the task that awaits this, from where it suspended
    (awaiting ``awaiting``) outside any task: what ``await coro`` would have done."""
    try:
        if error is not None:
            awaiting = coro.throw(error)
        while True:
            try:
                sent = yield awaiting
            except BaseException as exc:  # the task's cancellation, or a bad yield
                awaiting = coro.throw(exc)
            else:
                awaiting = coro.send(sent)
    except StopIteration as done:
        return done.value
