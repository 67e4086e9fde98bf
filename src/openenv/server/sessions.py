"""Sessions: the session core (``server/session_core.py``) with its calls run, and its slot.

``Session`` runs the calls its core plans: a plain ``def`` on a worker thread
(``server/handoff.py``), an ``async def`` on the event loop, within the
call's deadline; its slot comes from ``server/slots.py``. It touches no
socket: the transports (``server/endpoint.py`` for ``/ws`` and ``/web/ws``,
``server/mux.py`` for protocol v2, MCP, OpenReward's routes, the in-process
runtime) do the I/O and hand it requests.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Coroutine, Mapping
from typing import Any

from openenv import protocol
from openenv.environment import Environment
from openenv.protocol import ErrorCode, FrameError
from openenv.server import calls
from openenv.server.direct_steps import Batched, DirectStep, DirectStepping
from openenv.server.handoff import LaneTicket
from openenv.server.session_core import Call, CallKind, SessionCore
from openenv.server.session_host import (
    EnvFailure,
    Lane,
    SessionHost,
    SessionState,
)
from openenv.tools import ToolOutput
from openenv.types import Observation

__all__ = ["EnvFailure", "Lane", "Session", "SessionHost", "SessionState"]

logger = logging.getLogger("openenv.server")

_STEP = CallKind.STEP


class Session(SessionCore, DirectStepping):
    """A ``SessionCore`` whose calls run, counted against its server's cap.

    After ``handle`` returns, ``state`` tells the transport whether to go on;
    when it is no longer ``OPEN``, ``close_code`` says how to close.
    """

    # Request types a recording leaves out: the web page's own reads, which
    # its player never made (``endpoint.PAGE_READS``).
    unrecorded: frozenset[str] = frozenset()

    def __init__(self, env: Environment[Any, Any, Any], service: SessionHost) -> None:
        SessionCore.__init__(self, env, service.action_cls, service.settings, service.metrics)
        self.busy = False
        self.last_active = time.monotonic()
        self._service = service
        self._abandoned = False
        # This session's lane in the thread hand-over (see server/handoff.py).
        self.ticket = LaneTicket()
        self._submit = functools.partial(service.handoff.submit, self.ticket)
        # Steps without a deadline may start outside any coroutine (``try_step``):
        # a plain ``def`` on the lane, an ``async def`` at once, in a task;
        # nothing to time out.
        self._recorder = getattr(service, "recorder", None)
        # A recorded session takes the one path where request and reply meet.
        self.direct_steps = self._settings.step_timeout is None and self._recorder is None
        self._async_step = calls.is_async(self.env_step)
        self._dispatch_step = functools.partial(
            service.handoff.dispatch, self.ticket, self.env_step
        )
        self._direct_step: DirectStep | Batched | None = None  # the one in flight
        self.batched_call: Call | None = None  # see server/step_batches.py
        # An ``async def`` step that suspended as a part of the session's task
        # (Python 3.11), and what it awaits: ``settled()`` finishes it there.
        self._suspended: tuple[Coroutine[Any, Any, Any], Any] | None = None
        self._settled: asyncio.Future[None] | None = None
        service.registry.add(self)
        self._metrics.opened += 1
        if self._recorder is not None:
            self._recorder.opened(self.id)

    async def handle(
        self, frame: str | bytes | None, request: dict[str, Any] | None = None
    ) -> str | None:
        """Serve one client frame, or one ``request`` already decoded (a v2 frame
        carries many); return the reply frame, or ``None`` for ``close``."""
        self.busy = True
        recorder = self._recorder
        started = time.time() if recorder is not None else 0.0
        reply: str | None = None
        try:
            try:
                if request is None:
                    assert frame is not None
                    request = protocol.decode_frame(frame)
                # Nearly every request is a step: the core's plan() without its frame.
                step = protocol.plain_step(request)
                work = self.step_call(*step) if step is not None else self.plan(request)
            except FrameError as exc:
                reply = self.refusal(exc)
                return reply
            if not isinstance(work, Call):
                reply = work  # answered at once (or None: a close)
                return reply
            try:
                if work.timeout is None and work.kind is _STEP:
                    # Nearly every call: a step without a deadline, awaited right
                    # here (no coroutine of _perform's around it), its kind known
                    # since the session began.
                    if self._async_step:
                        value = await work.fn(*work.args)
                    else:
                        value = await self._submit(work.fn, work.args, work.kwargs)
                    if not isinstance(value, Observation) and inspect.isawaitable(value):
                        value = await value
                else:
                    value = await self._perform(work)
            except Exception as exc:
                reply = self.finish(work, False, exc)
            else:
                reply = self.finish(work, True, value)
            return reply
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and calls.being_cancelled():
                raise  # this task is: a shutdown, or the connection went away
            # SystemExit or the like out of an environment's coroutine, or a
            # CancelledError of its own (a future it awaited was cancelled): it
            # ends this session, never the server (as on the direct path).
            reply = self.internal_error(exc, request.get("id") if request is not None else None)
            return reply
        finally:
            self.busy = False
            self.last_active = time.monotonic()
            if (
                recorder is not None
                and reply is not None  # a close is its own event
                and (request is None or request.get("type") not in self.unrecorded)
            ):
                if frame is None:
                    frame = protocol.json_text(request)
                recorder.call(self.id, started, frame, reply)

    def handle_request(self, request: dict[str, Any]) -> Coroutine[Any, Any, str | None]:
        """``handle`` for a request already decoded."""
        return self.handle(None, request)

    async def _perform(self, call: Call) -> Any:
        """Run ``call``: a plain ``def`` on a worker thread, within its deadline."""
        return await calls.call(
            call.fn, *call.args, submit=self._submit, timeout=call.timeout, **call.kwargs
        )

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any],
        request_id: protocol.RequestId | None = None,
    ) -> ToolOutput:
        """Validate and run one tool call (for MCP, which wants the output, not a frame).

        Refusals raise ``FrameError``; failures of the tool itself raise
        ``EnvFailure``. A fatal one (a blocking call past its deadline, a
        ``SystemExit`` out of the tool) has ended the session: ``state`` is no
        longer ``OPEN``, and the caller must close it, as ``handle``'s would.
        """
        call = self.tool_call(name, arguments, request_id)
        self.busy = True  # as in ``handle``: abandon() leaves a call in flight without close()
        try:
            value = await self._perform(call)
        except Exception as exc:
            failure = self.failure(call, exc)
            if failure.fatal:
                self.refusal(failure)  # ends the session
            raise failure from None
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and calls.being_cancelled():
                raise
            # Out of the transport's task, a SystemExit would stop the whole
            # server (MCP's task group): it ends this session, as in ``handle``.
            self.internal_error(exc, request_id)
            raise EnvFailure(
                ErrorCode.SESSION_ERROR, "internal server error", request_id, fatal=True
            ) from None
        finally:
            self.busy = False
        output: ToolOutput = self.outcome(call, value)
        return output

    def abandon(self) -> None:
        """Give up on this session's environment (a shutdown past its deadline):
        ``aclose`` frees the slot without waiting for a call still running on a
        thread, and without ``close()``, which must not run beside that call."""
        self.cancel_queued(self._closing_because)
        self.interrupt()  # an async def step try_step started: nobody will wait for it
        # Only a call in flight now makes close() unsafe; an idle one still closes.
        self._abandoned = self.busy or self.stuck is not None or self._direct_step is not None

    def cancel_queued(self, because: str) -> None:
        """Calls of this session that no thread has started yet will never start;
        their callers are answered ``SESSION_ERROR`` with ``because``. For a
        session that is ending."""
        self._closing_because = because
        self._service.handoff.drop_queued(self.ticket)

    async def aclose(self, reason: str) -> None:
        """Close the environment and free the slot, exactly once.

        If a blocking call overran its deadline, wait for its thread first:
        ``close()`` must never run beside another call of the same instance.
        """
        if self.state is SessionState.CLOSED:
            return
        self.state = SessionState.CLOSED
        try:
            if self._abandoned:
                self.log.error("a call still runs on a thread; abandoning it without close()")
                return
            if self._direct_step is not None:
                await self.settled()
            if self.stuck is not None:
                self.log.warning("waiting for an overrunning call to return before close()")
                await asyncio.wait([self.stuck])
            close = self.env.close
            # Environment's own close() does nothing: no thread hop for it.
            if getattr(close, "__func__", None) is not _NOTHING_TO_CLOSE:
                submit = self._submit
                if self.ticket.closed:  # queued calls are refused, but close() must run
                    ticket = LaneTicket()
                    ticket.slow = self.ticket.slow
                    submit = functools.partial(self._service.handoff.submit, ticket)
                await calls.call(close, submit=submit, timeout=self._settings.close_timeout)
        except calls.DeadlineExceeded as exc:
            self.log.error("close() %s; the slot is freed anyway", exc)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and calls.being_cancelled():
                raise
            # A SystemExit (sys.exit() in close()) too: let out of this task, it
            # would stop the server's event loop, and every session with it.
            self.log.exception("close() raised; the slot is freed anyway")
        finally:
            self._service.registry.remove(self)
            self._metrics.closed[reason] += 1
            if self._recorder is not None:
                self._recorder.closed(self.id, reason)
            if logger.isEnabledFor(logging.DEBUG):
                self.log.debug("closed (%s)", reason)


_NOTHING_TO_CLOSE = Environment.close
