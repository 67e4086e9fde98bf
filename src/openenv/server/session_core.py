"""The session core: what a request asks of an environment, and the reply its outcome makes.

No I/O and no event loop here, as websockets' ``protocol.py`` has none.
``plan`` turns a decoded request into the ``Call`` to make (which of the
environment's methods, with which arguments, within which deadline) or into
its reply at once (a refusal, the tool list); ``finish`` takes that call's
outcome and returns the reply frame, with the state change it implies (a
reset's task, a tool that ended the episode, a fatal error that ends the
session). Running the call is the caller's business: ``Session``
(``server/sessions.py``) runs it on a worker thread or the event loop for
every transport (``/ws`` v1 and v2, ``/web/ws``, MCP, OpenReward's routes,
the in-process runtime), and a test can run it by hand:

>>> from openenv import Action, Environment, EnvError, Observation, State
>>> from openenv.server import ServerSettings
>>> from openenv.server.metrics import Metrics
>>> from openenv.server.slots import SessionRegistry
>>> class Say(Action):
...     text: str
>>> class Heard(Observation):
...     text: str
>>> class Parrot(Environment[Say, Heard, State]):
...     def reset(self, seed=None, episode_id=None, **kwargs):
...         return Heard(text="")
...     def step(self, action, **kwargs):
...         return Heard(text=action.text, reward=1.0)
>>> core = SessionCore(Parrot(), Say, ServerSettings(), Metrics(SessionRegistry(1)))
>>> call = core.plan({"type": "step", "data": {"text": "hi"}, "id": 1})
>>> call.name, call.args
('step()', (Say(metadata={}, text='hi'),))
>>> core.finish(call, True, call.fn(*call.args))
'{"type":"observation","data":{"observation":{"text":"hi"},"reward":1.0,"done":false},"id":1}'
>>> import json
>>> json.loads(core.finish(call, False, EnvError("too loud")))["data"]  # it raised
{'message': 'step() raised EnvError: too loud', 'code': 'EXECUTION_ERROR'}
>>> # A request refused is answered at once, with no call:
>>> json.loads(core.plan({"type": "step", "data": {}, "id": 2}))["data"]["code"]
'VALIDATION_ERROR'
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from openenv import protocol
from openenv.environment import Environment, server_method
from openenv.errors import EnvError
from openenv.protocol import CloseCode, ErrorCode, FrameError
from openenv.server.calls import DeadlineExceeded
from openenv.server.handoff import NotStarted
from openenv.server.isolation import EnvProcessDied, ProcessEnvironment
from openenv.server.redact import failure_text
from openenv.server.reset_args import ResetArgs
from openenv.server.session_host import (
    EnvFailure,
    SessionLog,
    SessionState,
    read_state,
    unknown_tool_message,
)
from openenv.tasks import TaskSpec
from openenv.tools import ToolOutput, tools_of
from openenv.types import Action, Observation, State

if TYPE_CHECKING:
    from openenv.server.config import ServerSettings
    from openenv.server.metrics import Metrics

__all__ = ["Call", "CallKind", "SessionCore"]

_R = TypeVar("_R")

logger = logging.getLogger("openenv.server")


class CallKind(enum.Enum):
    STEP = "step"
    RESET = "reset"
    STATE = "state"
    TOOL = "tool"
    PROMPT = "prompt"


_STEP = CallKind.STEP


class Call:
    """One call into the environment that a request asks for: ``fn(*args, **kwargs)``.

    ``timeout`` is its deadline in seconds (``None``: none); ``started`` when
    it was planned (``time.perf_counter``, for the step-time metric); ``then``
    what its success sets (a reset's task, a tool's name).
    """

    __slots__ = ("args", "fn", "kind", "kwargs", "name", "request_id", "started", "then", "timeout")

    def __init__(
        self,
        kind: CallKind,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        request_id: protocol.RequestId | None,
        timeout: float | None,
        kwargs: dict[str, Any] | None = None,
        then: Any = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.fn = fn
        self.args = args
        self.kwargs = kwargs if kwargs is not None else _NO_KWARGS
        self.request_id = request_id
        self.timeout = timeout
        self.then = then
        self.started = time.perf_counter()


# The keyword arguments of a call that takes none: one dict for all (never mutated).
_NO_KWARGS: dict[str, Any] = {}


# Frames that are the client's fault; a run of them ends the session.
_CLIENT_FAULTS = frozenset(
    {ErrorCode.INVALID_JSON, ErrorCode.UNKNOWN_TYPE, ErrorCode.VALIDATION_ERROR}
)


class SessionCore:
    """One environment instance, and what each of its client's requests does to it.

    ``state`` says whether the session goes on; once it is not ``OPEN``,
    ``close_code`` says how to close the connection.
    """

    _closing_because = "the session is closing"
    # What a tool call refused as EPISODE_FINISHED tells its caller to do. A
    # surface with no reset (MCP, OpenReward: one episode a session) says its own.
    play_again = "reset() to start a new one"

    def __init__(
        self,
        env: Environment[Any, Any, Any],
        action_cls: type[Action],
        settings: ServerSettings,
        metrics: Metrics,
    ) -> None:
        self.id = os.urandom(6).hex()  # as unique as uuid4().hex[:12], at a third of the cost
        self.env = env
        self.state = SessionState.OPEN
        self.close_code = CloseCode.NORMAL
        self._settings = settings
        self._metrics = metrics
        # model_validate without its Python wrapper (a third of a small action's
        # validation); the validator is the model's documented one.
        self._validate_action = action_cls.__pydantic_validator__.validate_python
        # Only what a step reads is kept: a session past 30 attributes loses
        # CPython's shared-key instance dict, and every attribute read on the
        # batched path gets dearer (6% of a v2 step, measured with v2_path.py).
        self.env_step = server_method(env, "step")
        self._reset_args = ResetArgs.of(env)
        self._bad_frames = 0
        # What a plain def that overran its deadline still runs as (DeadlineExceeded.stuck):
        # close() must wait for it.
        self.stuck: Any = None
        try:
            self.tools = tools_of(type(env))
        except TypeError as exc:  # a misdeclared @tool on a class create_app could not see
            self.log.error("%s has no usable tools: %s", type(env).__name__, exc)
            self.tools = {}
        self.task: TaskSpec | None = None
        # The tool whose call ended the episode; tool calls are refused until a reset.
        self.finished_by: str | None = None

    @functools.cached_property
    def log(self) -> SessionLog:
        """This session's logger, made on first use: most sessions never log."""
        return SessionLog(logger, {"session_id": self.id})

    # -- requests --------------------------------------------------------------

    def plan(self, request: dict[str, Any]) -> Call | str | None:
        """The call ``request`` asks for, or its reply at once (``None``: a close)."""
        try:
            step = protocol.plain_step(request)
            if step is not None:  # nearly every request: no model built for it
                return self.step_call(*step)
            return self._plan(protocol.validate_client_message(request))
        except FrameError as exc:
            return self.refusal(exc)

    def step_call(
        self, data: Any, request_id: protocol.RequestId | None, started: float | None = None
    ) -> Call:
        """The call of a step with action ``data``; ``FrameError`` if it is no action.

        ``started``: when a caller that plans the steps of many sessions at once
        (a v2 batch) planned them (``time.perf_counter``), else now.
        """
        try:
            action = self._validate_action(data)
        except ValidationError as exc:
            raise protocol.validation_frame_error(exc, "action", request_id) from None
        call = Call(
            _STEP, "step()", self.env_step, (action,), request_id, self._settings.step_timeout
        )
        if started is not None:
            call.started = started
        return call

    def _plan(self, message: protocol.ClientMessage) -> Call | str | None:
        if isinstance(message, protocol.StepRequest):
            return self.step_call(message.data, message.id)
        if isinstance(message, protocol.ResetRequest):
            return self._reset_call(message)
        timeout = self._settings.step_timeout
        if isinstance(message, protocol.StateRequest):
            return Call(CallKind.STATE, "state", read_state, (self.env,), message.id, timeout)
        if isinstance(message, protocol.CallToolRequest):
            return self.tool_call(message.data.name, message.data.arguments, message.id)
        if isinstance(message, protocol.ListToolsRequest):
            self._bad_frames = 0
            return protocol.tools_frame([spec.info for spec in self.tools.values()], message.id)
        if isinstance(message, protocol.GetPromptRequest):
            return self._prompt_call(message)
        self._end(CloseCode.NORMAL)
        return None

    def _reset_call(self, message: protocol.ResetRequest) -> Call:
        kwargs = self._reset_args.kwargs(message.data, message.id)
        return Call(
            CallKind.RESET,
            "reset()",
            server_method(self.env, "reset"),
            (),
            message.id,
            self._settings.reset_timeout,
            kwargs,
            then=kwargs.get("task"),
        )

    def tool_call(
        self,
        name: str,
        arguments: Mapping[str, Any],
        request_id: protocol.RequestId | None = None,
    ) -> Call:
        """The call of tool ``name``; ``FrameError`` if it cannot be called so."""
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
                f"the episode is over (the {self.finished_by!r} tool ended it), so "
                f"{name!r} cannot be called; {self.play_again}",
                request_id=request_id,
            )
        try:
            args = spec.arguments.model_validate(arguments)
        except ValidationError as exc:
            error = protocol.validation_frame_error(exc, f"arguments for tool {name!r}", request_id)
            # A model wrote them, and is told what to fix: a run of such calls
            # is an agent learning, not a broken client (as on MCP, not counted).
            error.bad_frame = False
            raise error from None
        timeout = self._settings.step_timeout
        bound = spec.bind(self.env, args)
        return Call(CallKind.TOOL, f"tool {name!r}", bound, (), request_id, timeout, then=name)

    def _prompt_call(self, message: protocol.GetPromptRequest) -> Call:
        if message.data.task is not None:
            task = self._reset_args.task(message.data.task, message.id)
        elif self.task is not None:
            task = self.task
        else:
            raise FrameError(
                ErrorCode.VALIDATION_ERROR,
                "no task to give a prompt for: pass one, or reset(task=...) first",
                request_id=message.id,
            )
        get_prompt = type(self.env).get_prompt
        timeout = self._settings.step_timeout
        return Call(CallKind.PROMPT, "get_prompt()", get_prompt, (task,), message.id, timeout)

    # -- outcomes --------------------------------------------------------------

    def finish(self, call: Call, ok: bool, value: Any) -> str:
        """The reply to ``call``, which returned ``value`` (``ok``) or raised it."""
        if ok and call.kind is _STEP and isinstance(value, Observation):
            # Nearly every call: outcome() and _encode() for a step, unrolled.
            self._metrics.step_seconds.observe(time.perf_counter() - call.started)
            reply = protocol.observation_frame(value, call.request_id)
            self._bad_frames = 0
            return reply
        try:
            if not ok:
                raise self.failure(call, value)
            reply = self._encode(call, self.outcome(call, value))
        except EnvFailure as exc:
            return self.refusal(exc)
        self._bad_frames = 0
        return reply

    def count_steps(self, seconds: float, count: int) -> None:
        """Count ``count`` steps of ``seconds`` each in the step-time metric
        (a batch's, answered together: ``server/step_batches.py``)."""
        self._metrics.step_seconds.observe(seconds, count)

    def outcome(self, call: Call, value: Any) -> Any:
        """What ``call`` returned, checked and taken in; ``EnvFailure`` if it is unfit."""
        kind = call.kind
        if kind is _STEP:
            observation = self._checked(call, value, Observation)
            self._metrics.step_seconds.observe(time.perf_counter() - call.started)
            return observation
        if kind is CallKind.RESET:
            observation = self._checked(call, value, Observation)
            self.task = call.then
            self.finished_by = None
            return observation
        if kind is CallKind.STATE:
            return self._checked(call, value, State)
        if kind is CallKind.PROMPT:
            return self._checked(call, value, str)
        try:
            # A ToolOutput or block the tool built is checked too, and NumPy
            # values made plain: the reply's encoder (or MCP's) would fail on them.
            output = ToolOutput.wrap(value).as_sent()
        except (TypeError, ValueError) as exc:  # a return value that is not JSON
            raise EnvFailure(
                ErrorCode.EXECUTION_ERROR,
                f"{call.name} returned a value that cannot be sent: {exc}",
                call.request_id,
            ) from None
        if output.finished:
            self.finished_by = call.then
        return output

    def _encode(self, call: Call, result: Any) -> str:
        kind, request_id = call.kind, call.request_id
        if kind is _STEP or kind is CallKind.RESET:
            return protocol.observation_frame(result, request_id)
        if kind is CallKind.STATE:
            finished = self.finished_by is not None if self.tools else None
            return protocol.state_frame(result, request_id, finished=finished)
        if kind is CallKind.TOOL:
            return protocol.tool_result_frame(result, request_id)
        return protocol.prompt_frame(result, request_id)

    def _checked(self, call: Call, result: Any, expected: type[_R]) -> _R:
        if not isinstance(result, expected):
            raise EnvFailure(
                ErrorCode.EXECUTION_ERROR,
                # The class's own name, also for one in a child process (not its proxy's).
                f"{call.name} of {self._reset_args.env_name} returned {type(result).__name__}, "
                f"expected {expected.__name__}",
                call.request_id,
            )
        return result

    def failure(self, call: Call, exc: Exception) -> EnvFailure:
        """The error for a call that raised ``exc`` or overran its deadline."""
        name, request_id = call.name, call.request_id
        if isinstance(exc, DeadlineExceeded):
            killed = isinstance(self.env, ProcessEnvironment) and self.env.killed
            if exc.stuck is not None or killed:
                # A thread cannot be stopped: end the session, and keep the slot
                # (and the environment) until the thread returns. An isolated call
                # was stopped by killing its process: nothing is left to step.
                self.stuck = exc.stuck
                why = (
                    "its process was killed" if killed else "a blocking call cannot be interrupted"
                )
                self.log.error("%s overran its %gs deadline; ending the session", name, exc.seconds)
                return EnvFailure(
                    ErrorCode.TIMEOUT,
                    f"{name} did not return within {exc.seconds:g}s; the session is closed "
                    f"because {why}",
                    request_id,
                    fatal=True,
                )
            return EnvFailure(
                ErrorCode.TIMEOUT,
                f"{name} did not return within {exc.seconds:g}s and was cancelled",
                request_id,
            )
        if isinstance(exc, NotStarted):  # the session is ending (e.g. a shutdown) while it queued
            return EnvFailure(ErrorCode.SESSION_ERROR, self._closing_because, request_id)
        if isinstance(exc, EnvProcessDied):  # isolation="process": nothing left to step
            self.log.error("%s: %s; ending the session", name, exc)
            return EnvFailure(
                ErrorCode.EXECUTION_ERROR,
                f"{name} failed: {exc}; the session is closed",
                request_id,
                fatal=True,
            )
        text = failure_text(exc, self._settings.error_details)
        if isinstance(exc, EnvError):
            # The environment's own word to its client (a move not allowed, a game
            # over): a line, as for any client's mistake, not a traceback per agent.
            self.log.info("%s raised %s", name, text)
            return EnvFailure(ErrorCode.EXECUTION_ERROR, f"{name} raised {text}", request_id)
        # The full text and traceback stay in the server log; the wire gets the
        # exception's type, and its message only if the environment marked it safe.
        self.log.error("%s raised", name, exc_info=exc)
        return EnvFailure(ErrorCode.EXECUTION_ERROR, f"{name} raised {text}", request_id)

    # -- refusals and the end --------------------------------------------------

    def refusal(self, exc: FrameError | EnvFailure) -> str:
        """The error reply to a refused request or a failed call; a fatal one ends the session."""
        if isinstance(exc, EnvFailure) and exc.fatal:
            self._end(CloseCode.INTERNAL_ERROR)
        bad = not isinstance(exc, FrameError) or exc.bad_frame
        return self._error(exc.code, exc.message, exc.request_id, bad=bad, **exc.details)

    def _error(
        self,
        code: ErrorCode,
        message: str,
        request_id: protocol.RequestId | None,
        *,
        bad: bool = True,
        **details: Any,
    ) -> str:
        self._metrics.errors[code.value] += 1
        if bad and code in _CLIENT_FAULTS:
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

    def internal_error(self, exc: BaseException, request_id: Any) -> str:
        """The reply when serving a request failed in a way no environment error explains
        (a ``SystemExit`` out of the environment, a bug): the session ends, the server goes on."""
        self.log.error("internal error", exc_info=exc)
        self._end(CloseCode.INTERNAL_ERROR)
        self._metrics.errors[ErrorCode.SESSION_ERROR.value] += 1
        return protocol.error_frame(
            ErrorCode.SESSION_ERROR,
            "internal server error",
            request_id=request_id if type(request_id) in (int, str) else None,
        )

    def _end(self, close_code: CloseCode) -> None:
        self.state = SessionState.CLOSING
        self.close_code = close_code
