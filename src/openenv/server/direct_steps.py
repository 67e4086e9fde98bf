"""Steps started from the protocol's callback, without waking the session's task.

A session whose endpoint has a direct channel (``server/direct.py``), and every
session of a v2 connection, offers each well-formed step to ``try_step`` first:
a step of a plain ``def`` goes straight to its lane of worker threads, and its
reply is made in the callback that brings the result back. Anything else (an
``async def`` step, which runs in the session's task, other messages, bad
frames) is left to ``Session.handle``, which answers it in full. Nothing here
reaches into asyncio's internals: an ``async def`` step is awaited by the
session's task like any coroutine.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from openenv import protocol
from openenv.environment import Environment
from openenv.protocol import CloseCode, ErrorCode, FrameError
from openenv.server.session_host import EnvFailure, SessionLog, SessionState
from openenv.types import Observation

__all__ = ["DirectStep", "DirectStepping"]


class DirectStepping:
    """The part of ``Session`` that starts steps from a callback; ``Session`` provides the rest."""

    env: Environment[Any, Any, Any]
    state: SessionState
    busy: bool
    last_active: float
    direct_steps: bool
    _validate_action: Callable[[Any], Any]
    _async_step: bool
    _dispatch_step: Callable[..., None]
    _direct_step: DirectStep | None
    _settled: asyncio.Future[None] | None
    _bad_frames: int

    @property
    def log(self) -> SessionLog:
        raise NotImplementedError

    def _end(self, close_code: CloseCode) -> None:
        raise NotImplementedError

    def _failure(
        self,
        name: str,
        exc: Exception,
        request_id: protocol.RequestId | None,
        timeout: float | None,
    ) -> EnvFailure:
        raise NotImplementedError

    def _observed(self, result: Any, request_id: protocol.RequestId | None, started: float) -> str:
        raise NotImplementedError

    def _refusal(self, exc: FrameError | EnvFailure) -> str:
        raise NotImplementedError

    def try_step(self, frame: str | bytes, reply: Callable[[str], None]) -> bool:
        """Start a well-formed step of a plain ``def`` from a callback, without a task.

        ``reply`` gets the reply frame on the loop thread once the step returns;
        until then ``busy`` is true, and ``settled()`` waits for it. ``False``
        (anything else: an ``async def`` step, other messages, bad frames, a step
        already running) leaves the frame to ``handle``, which answers it in full.
        """
        if not self.direct_steps or self.busy or self.state is not SessionState.OPEN:
            return False
        try:
            request = protocol.decode_frame(frame)
        except FrameError:
            return False
        return self.try_step_request(request, reply)

    def try_step_request(self, request: dict[str, Any], reply: Callable[[str], None]) -> bool:
        """``try_step`` for a request already decoded (one of a v2 frame's)."""
        if (
            not self.direct_steps
            or self._async_step
            or self.busy
            or self.state is not SessionState.OPEN
        ):
            return False
        try:
            step = protocol.plain_step(request)
            if step is None:
                return False
            action = self._validate_action(step[0])
        except Exception:  # handle() runs it again and answers (or fails) in full
            return False
        receiver = DirectStep(self, step[1], reply)
        # Busy from here, as in handle(); _stepped clears both once it replies.
        self.busy = True
        self._direct_step = receiver
        self._dispatch_step((action,), {}, receiver)  # its outcome comes in a later callback
        return True

    async def settled(self) -> None:
        """Wait until the step ``try_step`` started has replied."""
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
            try:
                if not ok:
                    if not isinstance(value, Exception):
                        raise value  # KeyboardInterrupt and the like: not the env's failure
                    raise self._failure("step()", value, step.request_id, None)
                else:
                    reply = self._observed(value, step.request_id, step.started)
                    self._bad_frames = 0
            except EnvFailure as exc:
                reply = self._refusal(exc)
        except BaseException as exc:
            # What would have reached the endpoint's last resort in handle().
            self.log.error("internal error", exc_info=exc)
            self._end(CloseCode.INTERNAL_ERROR)
            reply = protocol.error_frame(
                ErrorCode.SESSION_ERROR, "internal server error", request_id=step.request_id
            )
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

    __slots__ = (
        "awaited",
        "reply",
        "request_id",
        "session",
        "started",
        "task",
    )

    def __init__(
        self,
        session: DirectStepping,
        request_id: protocol.RequestId | None,
        reply: Callable[[str], None],
    ) -> None:
        self.session = session
        self.request_id = request_id
        self.reply = reply
        self.started = time.perf_counter()
        self.awaited = False  # a plain def returned an awaitable, now awaited
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
