"""Sessions: one environment instance each, counted against one cap.

``Session`` turns decoded client frames into calls on its environment and
returns the reply frames; its slot comes from ``server/slots.py``. Neither touches a
socket: the endpoint in ``server/endpoint.py`` does the I/O.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from openenv import protocol
from openenv.environment import Environment
from openenv.protocol import CloseCode, ErrorCode, FrameError
from openenv.server import calls
from openenv.server.direct_steps import DirectStep, DirectStepping
from openenv.server.handoff import LaneTicket, NotStarted
from openenv.server.isolation import EnvProcessDied
from openenv.server.redact import failure_text
from openenv.server.session_host import (
    EnvFailure,
    Lane,
    SessionHost,
    SessionLog,
    SessionState,
    read_state,
    reset_facts,
    unknown_tool_message,
)
from openenv.tasks import TaskSpec
from openenv.tools import ToolOutput, tools_of
from openenv.types import Observation, State

if TYPE_CHECKING:
    pass

__all__ = ["EnvFailure", "Lane", "Session", "SessionHost", "SessionState"]

_R = TypeVar("_R")

logger = logging.getLogger("openenv.server")


class _ResetArgs(BaseModel):
    model_config = ConfigDict(extra="allow")

    seed: int | None = None
    episode_id: str | None = None


# Frames that are the client's fault; a run of them ends the session.
_CLIENT_FAULTS = frozenset(
    {ErrorCode.INVALID_JSON, ErrorCode.UNKNOWN_TYPE, ErrorCode.VALIDATION_ERROR}
)


class Session(DirectStepping):
    """One client's environment instance and the dispatch of its messages.

    After ``handle`` returns, ``state`` tells the endpoint whether to go on;
    when it is no longer ``OPEN``, ``close_code`` says how to close the socket.
    """

    def __init__(self, env: Environment[Any, Any, Any], service: SessionHost) -> None:
        self.id = os.urandom(6).hex()  # as unique as uuid4().hex[:12], at a third of the cost
        self.env = env
        self.state = SessionState.OPEN
        self.close_code = CloseCode.NORMAL
        self.busy = False
        self.last_active = time.monotonic()
        self._service = service
        self._settings = service.settings
        self._metrics = service.metrics
        self._reset_accepts, self._task_cls = reset_facts(env.reset)
        self._validate_action = service.action_cls.model_validate
        self._bad_frames = 0
        self._stuck: asyncio.Future[Any] | None = None
        self._abandoned = False
        # This session's lane in the thread hand-over (see server/handoff.py).
        self._ticket = LaneTicket()
        self._submit = functools.partial(service.handoff.submit, self._ticket)
        # Steps without a deadline may start outside any coroutine (``try_step``):
        # a plain ``def`` on the lane, an ``async def`` right there until it first
        # suspends; nothing to time out.
        self._recorder = getattr(service, "recorder", None)
        # A recorded session takes the one path where request and reply meet.
        self.direct_steps = self._settings.step_timeout is None and self._recorder is None
        self._async_step = calls.is_async(env.step)
        self._dispatch_step = functools.partial(service.handoff.dispatch, self._ticket, env.step)
        self._direct_step: DirectStep | None = None  # the one in flight
        # An ``async def`` step that suspended in ``try_step``, and what it awaits:
        # ``settled()`` finishes it in the session's task.
        self._suspended: tuple[Coroutine[Any, Any, Any], Any] | None = None
        self._settled: asyncio.Future[None] | None = None
        try:
            self.tools = tools_of(type(env))
        except TypeError as exc:  # a misdeclared @tool on a class create_app could not see
            self.log.error("%s has no usable tools: %s", type(env).__name__, exc)
            self.tools = {}
        self.task: TaskSpec | None = None
        # The tool whose call ended the episode; tool calls are refused until a reset.
        self.finished_by: str | None = None
        service.registry.add(self)
        self._metrics.opened += 1
        if self._recorder is not None:
            self._recorder.opened(self.id)

    @functools.cached_property
    def log(self) -> SessionLog:
        """This session's logger, made on first use: most sessions never log."""
        return SessionLog(logger, {"session_id": self.id})

    async def handle(self, frame: str | bytes) -> str | None:
        """Serve one client frame; return the reply frame, or ``None`` for ``close``."""
        return await self._handle(frame, None)

    async def handle_request(self, request: dict[str, Any]) -> str | None:
        """Serve one request already decoded (a v2 frame carries many): as ``handle``."""
        return await self._handle(None, request)

    async def _handle(self, frame: str | bytes | None, obj: dict[str, Any] | None) -> str | None:
        self.busy = True
        started = time.time()
        reply: str | None = None
        try:
            if obj is None:
                assert frame is not None
                obj = protocol.decode_frame(frame)
            step = protocol.plain_step(obj)
            # Steps are nearly every frame: one coroutine less on their way.
            reply = await (self._step(*step) if step is not None else self._dispatch(obj))
            self._bad_frames = 0
            return reply
        except (FrameError, EnvFailure) as exc:
            reply = self._refusal(exc)
            return reply
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # SystemExit or the like out of an environment's coroutine: it ends
            # this session, never the server (as on the direct path).
            self.log.error("internal error", exc_info=exc)
            self._end(CloseCode.INTERNAL_ERROR)
            request_id = obj.get("id") if obj is not None else None
            reply = protocol.error_frame(
                ErrorCode.SESSION_ERROR,
                "internal server error",
                request_id=request_id if type(request_id) in (int, str) else None,
            )
            return reply
        finally:
            self.busy = False
            self.last_active = time.monotonic()
            if self._recorder is not None and reply is not None:  # a close is its own event
                if frame is None:
                    frame = protocol.json_text(obj)
                self._recorder.call(self.id, started, frame, reply)

    async def _dispatch(self, obj: dict[str, Any]) -> str | None:
        message = protocol.validate_client_message(obj)
        if isinstance(message, protocol.StepRequest):
            return await self._step(message.data, message.id)
        if isinstance(message, protocol.ResetRequest):
            return await self._reset(message)
        if isinstance(message, protocol.StateRequest):
            state = await self._run(
                "state", message.id, State, self._settings.step_timeout, read_state, self.env
            )
            finished = self.finished_by is not None if self.tools else None
            return protocol.state_frame(state, message.id, finished=finished)
        if isinstance(message, protocol.CallToolRequest):
            output = await self.call_tool(message.data.name, message.data.arguments, message.id)
            return protocol.tool_result_frame(output, message.id)
        if isinstance(message, protocol.ListToolsRequest):
            tools = [spec.info for spec in self.tools.values()]
            return protocol.tools_frame(tools, message.id)
        if isinstance(message, protocol.GetPromptRequest):
            return await self._get_prompt(message)
        self._end(CloseCode.NORMAL)
        return None

    def _error(
        self, code: ErrorCode, message: str, request_id: protocol.RequestId | None, **details: Any
    ) -> str:
        self._metrics.errors[code.value] += 1
        if code in _CLIENT_FAULTS:
            self._bad_frames += 1
            if self._bad_frames >= self._settings.max_bad_frames:
                self.log.warning("closing after %d bad frames in a row", self._bad_frames)
                self._end(CloseCode.POLICY_VIOLATION)
                self._metrics.errors[ErrorCode.SESSION_ERROR.value] += 1
                return protocol.error_frame(
                    ErrorCode.SESSION_ERROR,
                    f"closing the session after {self._bad_frames} bad frames in a row "
                    f"(last: {code.value}: {message})",
                    request_id=request_id,
                )
        return protocol.error_frame(code, message, request_id=request_id, **details)

    def _refusal(self, exc: FrameError | EnvFailure) -> str:
        """The error reply to a refused frame or a failed call; a fatal one ends the session."""
        if isinstance(exc, EnvFailure) and exc.fatal:
            self._end(CloseCode.INTERNAL_ERROR)
        return self._error(exc.code, exc.message, exc.request_id, **exc.details)

    def _observed(self, result: Any, request_id: protocol.RequestId | None, started: float) -> str:
        """The reply to a step that returned ``result``, counted in the metrics."""
        observation = self._checked("step()", result, Observation, request_id)
        self._metrics.step_seconds.observe(time.perf_counter() - started)
        self._metrics.steps += 1
        return protocol.observation_frame(observation, request_id)

    def _end(self, close_code: CloseCode) -> None:
        self.state = SessionState.CLOSING
        self.close_code = close_code

    async def _step(self, data: dict[str, Any], request_id: protocol.RequestId | None) -> str:
        try:
            action = self._validate_action(data)
        except ValidationError as exc:
            raise protocol.validation_frame_error(exc, "action", request_id) from None
        started = time.perf_counter()
        timeout = self._settings.step_timeout
        if timeout is None:
            # The hot path: calls.call without its coroutine (or _run's) around it,
            # one suspended frame less for every step in flight.
            try:
                result = await calls.start(self.env.step, (action,), {}, self._submit)
                if not isinstance(result, Observation) and inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                raise self._failure("step()", exc, request_id, timeout) from None
        else:
            result = await self._run("step()", request_id, object, timeout, self.env.step, action)
        return self._observed(result, request_id, started)

    async def _reset(self, message: protocol.ResetRequest) -> str:
        try:
            args = _ResetArgs.model_validate(message.data)
        except ValidationError as exc:
            raise protocol.validation_frame_error(exc, "reset arguments", message.id) from None
        kwargs = args.model_dump(exclude_unset=True)
        if self._reset_accepts is not None:
            unknown = sorted(set(kwargs) - self._reset_accepts)
            if unknown:
                raise FrameError(
                    ErrorCode.VALIDATION_ERROR,
                    f"reset() of {type(self.env).__name__} does not accept "
                    f"{', '.join(map(repr, unknown))}; it accepts "
                    f"{', '.join(sorted(self._reset_accepts))}",
                    request_id=message.id,
                    details={
                        "errors": [
                            {"loc": ["data", k], "msg": "unexpected argument", "type": "extra"}
                            for k in unknown
                        ]
                    },
                )
        if kwargs.get("task") is not None:
            kwargs["task"] = self._parse_task(kwargs["task"], message.id)
        observation = await self._run(
            "reset()",
            message.id,
            Observation,
            self._settings.reset_timeout,
            self.env.reset,
            **kwargs,
        )
        self.task = kwargs.get("task")
        self.finished_by = None
        return protocol.observation_frame(observation, message.id)

    def _parse_task(self, data: Any, request_id: protocol.RequestId | None) -> TaskSpec:
        try:
            return self._task_cls.model_validate(data)
        except ValidationError as exc:
            raise protocol.validation_frame_error(exc, "task", request_id) from None

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any],
        request_id: protocol.RequestId | None = None,
    ) -> ToolOutput:
        """Validate and run one tool call.

        Refusals raise ``FrameError``; failures of the tool itself raise
        ``EnvFailure`` (fatal only for a blocking call that overran its deadline).
        """
        spec = self.tools.get(name)
        if spec is None:
            raise FrameError(
                ErrorCode.UNKNOWN_TOOL,
                unknown_tool_message(name, list(self.tools)),
                request_id=request_id,
                details={"tools": list(self.tools)},
            )
        if self.finished_by is not None:
            raise FrameError(
                ErrorCode.EPISODE_FINISHED,
                f"the episode is over (the {self.finished_by!r} tool ended it); "
                f"reset() to start a new one before calling {name!r}",
                request_id=request_id,
            )
        try:
            args = spec.arguments.model_validate(arguments)
        except ValidationError as exc:
            raise protocol.validation_frame_error(
                exc, f"arguments for tool {name!r}", request_id
            ) from None
        result = await self._run(
            f"tool {name!r}",
            request_id,
            object,
            self._settings.step_timeout,
            spec.bind(self.env, args),
        )
        try:
            output = ToolOutput.wrap(result)
        except (TypeError, ValueError) as exc:  # a return value that is not JSON
            raise EnvFailure(
                ErrorCode.EXECUTION_ERROR,
                f"tool {name!r} returned a value that cannot be sent: {exc}",
                request_id,
            ) from None
        if output.finished:
            self.finished_by = name
        return output

    async def _get_prompt(self, message: protocol.GetPromptRequest) -> str:
        if message.data.task is not None:
            task = self._parse_task(message.data.task, message.id)
        elif self.task is not None:
            task = self.task
        else:
            raise FrameError(
                ErrorCode.VALIDATION_ERROR,
                "no task to give a prompt for: pass one, or reset(task=...) first",
                request_id=message.id,
            )
        get_prompt = type(self.env).get_prompt
        prompt = await self._run(
            "get_prompt()", message.id, str, self._settings.step_timeout, get_prompt, task
        )
        return protocol.prompt_frame(prompt, message.id)

    async def _run(
        self,
        name: str,
        request_id: protocol.RequestId | None,
        expected: type[_R],
        timeout: float | None,
        fn: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> _R:
        """Call into the environment; its failures become error replies."""
        try:
            result = await calls.call(fn, *args, submit=self._submit, timeout=timeout, **kwargs)
        except Exception as exc:
            raise self._failure(name, exc, request_id, timeout) from None
        return self._checked(name, result, expected, request_id)

    def _failure(
        self,
        name: str,
        exc: Exception,
        request_id: protocol.RequestId | None,
        timeout: float | None,
    ) -> EnvFailure:
        """The error reply for an environment call that raised or overran."""
        if isinstance(exc, calls.DeadlineExceeded):
            if exc.stuck is not None:
                # The thread cannot be stopped: end the session, and keep the slot
                # (and the environment) until the thread returns.
                self._stuck = exc.stuck
                self.log.error("%s overran its %gs deadline; ending the session", name, timeout)
                return EnvFailure(
                    ErrorCode.TIMEOUT,
                    f"{name} did not return within {exc.seconds:g}s; the session is closed "
                    f"because a blocking call cannot be interrupted",
                    request_id,
                    fatal=True,
                )
            return EnvFailure(
                ErrorCode.TIMEOUT,
                f"{name} did not return within {exc.seconds:g}s and was cancelled",
                request_id,
            )
        if isinstance(exc, NotStarted):  # the session is ending (e.g. a shutdown) while it queued
            # The session is closing already: say why, as its closing frame does.
            return EnvFailure(ErrorCode.SESSION_ERROR, self._closing_because, request_id)
        if isinstance(exc, EnvProcessDied):  # isolation="process": nothing left to step
            self.log.error("%s: %s; ending the session", name, exc)
            return EnvFailure(
                ErrorCode.EXECUTION_ERROR,
                f"{name} failed: {exc}; the session is closed",
                request_id,
                fatal=True,
            )
        # The full text and traceback stay in the server log; the wire gets the
        # exception's type, and its message only if the environment marked it safe.
        self.log.error("%s raised", name, exc_info=exc)
        text = failure_text(exc, self._settings.error_details)
        return EnvFailure(ErrorCode.EXECUTION_ERROR, f"{name} raised {text}", request_id)

    def _checked(
        self, name: str, result: Any, expected: type[_R], request_id: protocol.RequestId | None
    ) -> _R:
        if not isinstance(result, expected):
            raise EnvFailure(
                ErrorCode.EXECUTION_ERROR,
                f"{name} of {type(self.env).__name__} returned {type(result).__name__}, "
                f"expected {expected.__name__}",
                request_id,
            )
        return result

    _closing_because = "the session is closing"

    def abandon(self) -> None:
        """Give up on this session's environment (a shutdown past its deadline):
        ``aclose`` frees the slot without waiting for a call still running on a
        thread, and without ``close()``, which must not run beside that call."""
        self.cancel_queued(self._closing_because)
        # Only a call in flight now makes close() unsafe; an idle one still closes.
        self._abandoned = self.busy or self._stuck is not None or self._direct_step is not None

    def cancel_queued(self, because: str) -> None:
        """Calls of this session that no thread has started yet will never start;
        their callers are answered ``SESSION_ERROR`` with ``because``. For a
        session that is ending."""
        self._closing_because = because
        self._service.handoff.drop_queued(self._ticket)

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
            if self._stuck is not None:
                self.log.warning("waiting for an overrunning call to return before close()")
                await asyncio.wait([self._stuck])
            close = self.env.close
            # Environment's own close() does nothing: no thread hop for it.
            if getattr(close, "__func__", None) is not _NOTHING_TO_CLOSE:
                submit = self._submit
                if self._ticket.closed:  # queued calls are refused, but close() must run
                    ticket = LaneTicket()
                    ticket.slow = self._ticket.slow
                    submit = functools.partial(self._service.handoff.submit, ticket)
                await calls.call(close, submit=submit, timeout=self._settings.close_timeout)
        except calls.DeadlineExceeded as exc:
            self.log.error("close() %s; the slot is freed anyway", exc)
        except Exception:
            self.log.exception("close() raised; the slot is freed anyway")
        finally:
            self._service.registry.remove(self)
            self._metrics.closed[reason] += 1
            if self._recorder is not None:
                self._recorder.closed(self.id, reason)
            if logger.isEnabledFor(logging.DEBUG):
                self.log.debug("closed (%s)", reason)


_NOTHING_TO_CLOSE = Environment.close
