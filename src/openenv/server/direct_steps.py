"""Steps started from the protocol's callback, without waking the session's task.

A session whose endpoint has a direct channel (``server/direct.py``) offers
each incoming frame to ``try_step`` first: a well-formed step of a plain
``def`` goes straight to its lane, and an ``async def`` step runs at once,
until it returns or first suspends, in a task: a step that never suspends is
answered right there, with no loop round. Anything else is left to
``Session.handle``, which answers it in full.

A v2 connection (``server/mux.py``) hands the plain ``def`` steps of a frame
to the threads together (``server/step_batches.py``); ``batched_outcome``
answers those of its outcomes that are not a plain observation, as
``try_step``'s receiver does.

Which task depends on what the running asyncio offers:

* Python 3.12 and later: an eager task of its own (``asyncio.eager_task_factory``,
  public), in the session's ``contextvars.Context``.
* CPython 3.11, which has no eager tasks: the session's own task, entered with
  ``asyncio.tasks._enter_task``/``_leave_task`` (private; a new task per step
  costs 15-18% of the server's CPU per echo step there, measured). A step that
  suspends is finished by that task (``settled``). 3.11 receives security
  fixes only, so its asyncio no longer changes; the internal is used on it
  alone (``TESTED_PYTHONS``).
* Anything else: ``try_step`` declines, and the session's task serves the step
  (``handle``), as under uvicorn's own protocols.

Either way, one step runs in one current task, and the steps of a session
share one context, so context variables carry over from step to step.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import sys
import time
import types
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

from openenv import protocol
from openenv.environment import Environment
from openenv.protocol import CloseCode, FrameError
from openenv.server.session_core import Call
from openenv.server.session_host import OPEN, SessionLog, SessionState
from openenv.types import Observation

__all__ = ["DirectStep", "DirectStepping"]


class DirectStepping:
    """The part of ``Session`` that starts steps from a callback; ``Session`` provides the rest."""

    env: Environment[Any, Any, Any]
    env_step: Callable[..., Any]  # what a step calls (server_method)
    state: SessionState
    busy: bool
    last_active: float
    direct_steps: bool
    _async_step: bool
    _dispatch_step: Callable[..., None]
    _direct_step: DirectStep | Batched | None
    batched_call: Call | None  # its last step call of a batch, planned anew for the next
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

        A plain ``def`` step goes to its lane; an ``async def`` step runs in
        ``context`` (the session's), in an eager task of its own or as a part
        of ``task`` (the session's task, on Python 3.11), until it returns or
        first suspends. If it suspended as a part of ``task``, ``suspended`` is
        true and that task must finish it with ``settled()``. ``reply`` gets
        the reply frame on the loop thread once the step returns, which may be
        before this returns; until then ``busy`` is true. ``False`` (anything
        else: other messages, bad frames, a step already running) leaves the
        frame to ``handle``, which answers it in full.
        """
        if not self.direct_steps or self.busy or self.state is not OPEN:
            return False
        try:
            request = protocol.decode_frame(frame)
        except FrameError:
            return False
        return self._try_step(request, reply, task, context)

    def batched_outcome(
        self, call: Call, ok: bool, value: Any, reply: Callable[[str], None]
    ) -> str | None:
        """The reply to a step of a batch (``server/step_batches.py``) whose call
        returned (``ok``) or raised ``value``; ``None`` if it returned an
        awaitable, which a task awaits and whose reply goes to ``reply``."""
        if ok and not isinstance(value, Observation) and inspect.isawaitable(value):
            step = DirectStep(self, call, reply)
            self._direct_step = step
            step.task = asyncio.ensure_future(run_step(step, value))
            return None
        return self._step_reply(call, ok, value, False)

    def try_step_request(
        self,
        request: dict[str, Any],
        reply: Callable[[str], None],
        task: asyncio.Task[Any] | None = None,
        context: contextvars.Context | None = None,
    ) -> bool:
        """``try_step`` for a request already decoded (one of a v2 frame's)."""
        if not self.direct_steps or self.busy or self.state is not OPEN:
            return False
        return self._try_step(request, reply, task, context)

    def _try_step(
        self,
        request: dict[str, Any],
        reply: Callable[[str], None],
        task: asyncio.Task[Any] | None,
        context: contextvars.Context | None,
    ) -> bool:
        if (
            self._async_step
            and _eager_task_factory is None
            and (task is None or context is None or _enter is None)
        ):
            return False  # no task to run it in here: handle() runs it in the session's
        call = self._plain_step_call(request)
        if call is None:
            return False
        receiver = DirectStep(self, call, reply)
        # Busy from here, as in handle(); _stepped clears both once it replies,
        # which an async def step that never suspends does before this returns.
        self.busy = True
        self._direct_step = receiver
        if not self._async_step:
            self._dispatch_step(call.args, {}, receiver)  # its outcome comes in a later callback
            return True
        if _eager_task_factory is not None:
            self._start_eager(receiver, call.args[0], context)
        elif not self._start_in(receiver, call.args[0], task, context):
            self.busy = False
            self._direct_step = None
            return False
        return True

    def _plain_step_call(self, request: dict[str, Any]) -> Call | None:
        """The call of a well-formed step; ``None`` for anything else, which
        ``handle()`` plans again and answers (or fails) in full."""
        try:
            step = protocol.plain_step(request)
            return None if step is None else self.step_call(*step)
        except Exception:
            return None

    def _start_eager(
        self, step: DirectStep, action: Any, context: contextvars.Context | None
    ) -> None:
        """Run an ``async def`` step in an eager task of its own (Python 3.12+)."""
        try:
            coro = self.env_step(action)
        except BaseException as exc:  # raised before returning its coroutine
            self._stepped(step, False, exc)
            return
        if not isinstance(coro, types.CoroutineType):
            self._stepped(step, True, coro)  # an awaitable: _stepped awaits it in a task
            return
        assert _eager_task_factory is not None
        step.task = _eager_task_factory(
            asyncio.get_running_loop(), run_step(step, coro), context=context
        )

    def _start_in(
        self,
        step: DirectStep,
        action: Any,
        task: asyncio.Task[Any] | None,
        context: contextvars.Context | None,
    ) -> bool:
        """Run an ``async def`` step as a part of ``task`` (Python 3.11), until it
        returns or first suspends; ``False`` if it cannot start here (nothing has run).

        What an eager task does on 3.12, inside a task that already exists:
        ``asyncio.current_task()`` is ``task``, so ``asyncio.timeout`` and task
        groups work, and the rest runs in that same task (``settled``).
        """
        assert task is not None
        assert context is not None
        assert _enter is not None
        assert _leave is not None
        loop = task.get_loop()
        try:
            _enter(loop, task)
        except RuntimeError:  # another task is running: not a protocol callback
            return False
        try:
            coro = self.env_step(action)
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
                    self._suspended = (coro, awaiting)  # the session's task finishes it
                    return True
        except BaseException as exc:  # raised before returning its coroutine
            ok, value = False, exc
        finally:
            _leave(loop, task)
        self._stepped(step, ok, value)
        return True

    @property
    def suspended(self) -> bool:
        """Whether an ``async def`` step ``try_step`` started waits for ``settled()``
        (only on Python 3.11: elsewhere it runs in a task of its own)."""
        return self._suspended is not None

    @property
    def step_task(self) -> asyncio.Future[None] | None:
        """The task running the step ``try_step`` started, if it runs in one."""
        step = self._direct_step
        return None if step is None else step.task

    def interrupt(self) -> None:
        """Cancel the step ``try_step`` started, if it runs in a task: the
        session's own task is being cancelled (a shutdown, a stalled client), and
        the step hears of it as it would have inside that task. The session ends."""
        step = self._direct_step
        if isinstance(step, DirectStep) and step.task is not None and not step.task.done():
            step.interrupted = True
            step.task.cancel()

    async def settled(self, error: BaseException | None = None) -> None:
        """Wait until the step ``try_step`` started has replied.

        A step that suspended as a part of the session's task (Python 3.11)
        goes on here, in that task, with ``error`` (a cancellation of the task)
        thrown in.
        """
        suspended, self._suspended = self._suspended, None
        if suspended is not None and self._direct_step is not None:
            coro, awaiting = suspended
            step = self._direct_step
            assert isinstance(step, DirectStep)  # it suspended: no batch's
            step.interrupted = True  # a cancellation from here on is the session task's
            await run_step(step, resume(coro, awaiting, error))
        while self._direct_step is not None:
            if self._settled is None:
                self._settled = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._settled)

    def _stepped(self, step: DirectStep, ok: bool, value: Any) -> None:
        """A ``try_step`` step returned (or raised): reply, as ``handle`` would have."""
        awaitable = not isinstance(value, Observation) and inspect.isawaitable(value)
        if ok and awaitable and not step.awaited:
            # A plain def that returned an awaitable: finish it in a task.
            step.task = asyncio.ensure_future(run_step(step, value))
            return
        reply = self._step_reply(step.call, ok, value, step.interrupted)
        if reply is not None:
            step.reply(reply)

    def _step_reply(self, call: Call, ok: bool, value: Any, interrupted: bool) -> str | None:
        """The reply to a step that returned (or raised) ``value``; the session is idle again."""
        reply: str | None = None
        try:
            if not ok and interrupted and isinstance(value, asyncio.CancelledError):
                # The session's own task was cancelled (a shutdown): it ends
                # the session as it unwinds, and nobody waits for a reply.
                self._end(CloseCode.GOING_AWAY)
            elif not ok and not isinstance(value, Exception):
                raise value  # KeyboardInterrupt and the like: not the env's failure
            else:
                reply = self.finish(call, ok, value)
        except BaseException as exc:
            # What would have reached handle()'s last resort.
            reply = self.internal_error(exc, call.request_id)
        self.busy = False
        self.last_active = time.monotonic()
        self._direct_step = None
        settled, self._settled = self._settled, None
        if settled is not None and not settled.done():
            settled.set_result(None)
        return reply


class DirectStep:
    """A step started by ``Session.try_step``: the lane's receiver of its outcome."""

    __slots__ = ("awaited", "call", "interrupted", "reply", "session", "task")

    def __init__(self, session: DirectStepping, call: Call, reply: Callable[[str], None]) -> None:
        self.session = session
        self.call = call
        self.reply = reply
        self.awaited = False  # its awaitable is being awaited in a task
        self.interrupted = False  # its task was cancelled by the session's (``interrupt``)
        self.task: asyncio.Future[None] | None = None  # the task awaiting it

    def cancelled(self) -> bool:
        return False  # nobody can give up on it: the session waits for its reply

    def set_result(self, result: Any, /) -> None:
        self.session._stepped(self, True, result)

    def set_exception(self, exception: BaseException, /) -> None:
        self.session._stepped(self, False, exception)


class Batched:
    """What a session's step in a batch is while it runs: no task of its own."""

    __slots__ = ()
    task: asyncio.Future[None] | None = None


BATCHED = Batched()


async def run_step(step: DirectStep, awaitable: Any) -> None:
    """Await a step's awaitable and hand its outcome to the session: the body of
    its task. Whatever it raises ends at the session (``SystemExit`` included:
    an environment's failure never stops the server); a cancellation also ends
    the task."""
    step.awaited = True
    try:
        result = await awaitable
    except BaseException as exc:
        step.set_exception(exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
    else:
        step.set_result(result)


# asyncio's public eager tasks (Python 3.12 and later).
_eager_task_factory: Callable[..., asyncio.Future[None]] | None = getattr(
    asyncio, "eager_task_factory", None
)

# The CPython releases whose asyncio's ``_enter_task``/``_leave_task`` this was
# tested with (the suite's direct-step tests): only where there are no eager tasks.
TESTED_PYTHONS = ((3, 11),)


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


_enter, _leave = _task_switch()

if _eager_task_factory is None and _enter is None:
    logging.getLogger("openenv.server").warning(
        "async def steps are served by their session's task on %s %s (no eager tasks, and "
        "asyncio's task switch untested here): correct, ~15%% more CPU per step",
        sys.implementation.name,
        ".".join(map(str, sys.version_info[:3])),
    )


@types.coroutine
def resume(
    coro: Coroutine[Any, Any, Any], awaiting: Any, error: BaseException | None
) -> Generator[Any, Any, Any]:
    """Go on with ``coro`` in the task that awaits this, from where it suspended
    (awaiting ``awaiting``) in ``_start_in``: what ``await coro`` would have done."""
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
