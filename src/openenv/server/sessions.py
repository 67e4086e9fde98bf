"""Sessions: one environment instance each, counted against one cap.

``SessionRegistry`` owns the slots; ``Session`` turns decoded client frames
into calls on its environment and returns the reply frames. Neither touches a
socket: the endpoint in ``server/endpoint.py`` does the I/O.
"""

from __future__ import annotations

import asyncio
import difflib
import enum
import inspect
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from openenv import protocol
from openenv.environment import Environment
from openenv.protocol import ErrorCode, FrameError
from openenv.tasks import TaskSpec, task_class
from openenv.tools import ToolOutput, tools_of
from openenv.types import Action, Observation, State

__all__ = ["Session", "SessionRegistry", "SessionState"]

_R = TypeVar("_R")

logger = logging.getLogger("openenv.server")


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class SessionRegistry:
    """The session slots of one server process.

    ``acquire`` and ``release`` never await, so on one event loop the check
    and the increment cannot interleave: the cap holds without a lock.
    """

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self._reserved = 0
        self.opened = 0
        self.closed: Counter[str] = Counter()

    @property
    def active(self) -> int:
        return self._reserved

    def acquire(self) -> bool:
        """Reserve a slot before the factory runs; ``False`` when full."""
        if self._reserved >= self.max_sessions:
            return False
        self._reserved += 1
        return True

    def release(self) -> None:
        self._reserved -= 1
        assert self._reserved >= 0, "session slot released twice"

    def add(self, session: Session) -> None:
        self.sessions[session.id] = session
        self.opened += 1

    def remove(self, session: Session, reason: str) -> None:
        del self.sessions[session.id]
        self.closed[reason] += 1
        self.release()


class _ResetArgs(BaseModel):
    model_config = ConfigDict(extra="allow")

    seed: int | None = None
    episode_id: str | None = None


class Session:
    """One client's environment instance and the dispatch of its messages."""

    def __init__(
        self,
        env: Environment[Any, Any, Any],
        action_cls: type[Action],
        registry: SessionRegistry,
        executor: Executor,
    ) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.env = env
        self.state = SessionState.OPEN
        self.busy = False
        self.last_active = time.monotonic()
        self._action_cls = action_cls
        self._registry = registry
        self._executor = executor
        self._reset_accepts = _accepted_kwargs(env.reset)
        self._task_cls = task_class(env.reset)
        try:
            self.tools = tools_of(type(env))
        except TypeError as exc:  # a misdeclared @tool on a class create_app could not see
            logger.error("session %s: %s has no usable tools: %s", self.id, type(env).__name__, exc)
            self.tools = {}
        self.task: TaskSpec | None = None
        # The tool whose call ended the episode; tool calls are refused until a reset.
        self.finished_by: str | None = None
        registry.add(self)

    async def handle(self, frame: str | bytes) -> str | None:
        """Serve one client frame; return the reply frame, or ``None`` for ``close``."""
        self.busy = True
        try:
            message = protocol.parse_client_message(frame)
            if isinstance(message, protocol.StepRequest):
                return await self._step(message)
            if isinstance(message, protocol.ResetRequest):
                return await self._reset(message)
            if isinstance(message, protocol.StateRequest):
                state = await self._run("state", message.id, State, _read_state, self.env)
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
            self.state = SessionState.CLOSING
            return None
        except FrameError as exc:
            return protocol.error_frame(
                exc.code, exc.message, request_id=exc.request_id, **exc.details
            )
        except _EnvFailure as exc:
            return protocol.error_frame(
                ErrorCode.EXECUTION_ERROR, exc.message, request_id=exc.request_id
            )
        finally:
            self.busy = False
            self.last_active = time.monotonic()

    async def _step(self, message: protocol.StepRequest) -> str:
        try:
            action = self._action_cls.model_validate(message.data)
        except ValidationError as exc:
            raise protocol.validation_frame_error(exc, "action", message.id) from None
        observation = await self._run("step()", message.id, Observation, self.env.step, action)
        return protocol.observation_frame(observation, message.id)

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
        observation = await self._run("reset()", message.id, Observation, self.env.reset, **kwargs)
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
        """Validate and run one tool call; refusals raise ``FrameError`` (never fatal)."""
        spec = self.tools.get(name)
        if spec is None:
            raise FrameError(
                ErrorCode.UNKNOWN_TOOL,
                _unknown_tool_message(name, list(self.tools)),
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
        try:
            result = await self._run(
                f"tool {name!r}", request_id, object, spec.bind(self.env, args)
            )
            output = ToolOutput.wrap(result)
        except _EnvFailure as exc:
            raise FrameError(
                ErrorCode.EXECUTION_ERROR, exc.message, request_id=request_id
            ) from None
        except (TypeError, ValueError) as exc:  # a return value that is not JSON
            raise FrameError(
                ErrorCode.EXECUTION_ERROR,
                f"tool {name!r} returned a value that cannot be sent: {exc}",
                request_id=request_id,
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
        prompt = await self._run("get_prompt()", message.id, str, get_prompt, task)
        return protocol.prompt_frame(prompt, message.id)

    async def _run(
        self,
        name: str,
        request_id: protocol.RequestId | None,
        expected: type[_R],
        fn: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> _R:
        """Call into the environment; its failures become ``EXECUTION_ERROR`` replies."""
        try:
            result = await self._call(fn, *args, **kwargs)
        except Exception as exc:
            # The traceback stays in the server log; the wire gets the exception's name.
            logger.exception("session %s: %s raised", self.id, name)
            raise _EnvFailure(f"{name} raised {type(exc).__name__}: {exc}", request_id) from None
        if not isinstance(result, expected):
            raise _EnvFailure(
                f"{name} of {type(self.env).__name__} returned {type(result).__name__}, "
                f"expected {expected.__name__}",
                request_id,
            )
        return result

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Await an ``async def``; run a plain ``def`` in a worker thread."""
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))
        if inspect.isawaitable(result):
            result = await result
        return result

    async def aclose(self, reason: str) -> None:
        """Close the environment and free the slot; safe to call more than once."""
        if self.state is SessionState.CLOSED:
            return
        self.state = SessionState.CLOSED
        try:
            await self._call(self.env.close)
        except Exception:
            logger.exception("session %s: close() raised; the slot is freed anyway", self.id)
        finally:
            self._registry.remove(self, reason)
            logger.debug("session %s closed (%s)", self.id, reason)


class _EnvFailure(Exception):
    def __init__(self, message: str, request_id: protocol.RequestId | None) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id


def _unknown_tool_message(name: str, known: list[str]) -> str:
    if not known:
        return f"unknown tool {name!r}: this environment has no tools"
    hint = difflib.get_close_matches(name, known, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    return f"unknown tool {name!r}; the tools are: {', '.join(known)}{suggestion}"


def _read_state(env: Environment[Any, Any, Any]) -> Any:
    return env.state


def _accepted_kwargs(fn: Callable[..., Any]) -> set[str] | None:
    """Keyword names ``fn`` accepts, or ``None`` when it takes ``**kwargs``."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
