"""Sessions: one environment instance each, counted against one cap.

``SessionRegistry`` owns the slots; ``Session`` turns decoded client frames
into calls on its environment and returns the reply frames. Neither touches a
socket: the endpoint in ``server/endpoint.py`` does the I/O.
"""

from __future__ import annotations

import enum
import inspect
import logging
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from openenv import protocol
from openenv.environment import Environment
from openenv.protocol import ErrorCode, FrameError
from openenv.server.handoff import Handoff, LaneTicket
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
        executor: Handoff,
    ) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.env = env
        self.state = SessionState.OPEN
        self.busy = False
        self.last_active = time.monotonic()
        self._action_cls = action_cls
        self._registry = registry
        self._executor = executor
        self._ticket = LaneTicket()
        self._reset_accepts = _accepted_kwargs(env.reset)
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
                return protocol.state_frame(state, message.id)
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
        observation = await self._run("reset()", message.id, Observation, self.env.reset, **kwargs)
        return protocol.observation_frame(observation, message.id)

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
        result = await self._executor.call(self._ticket, fn, *args, **kwargs)
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


def _read_state(env: Environment[Any, Any, Any]) -> Any:
    return env.state


def _accepted_kwargs(fn: Callable[..., Any]) -> set[str] | None:
    """Keyword names ``fn`` accepts, or ``None`` when it takes ``**kwargs``."""
    # Every session of a class asks about the same function: inspect it once.
    key = getattr(fn, "__func__", None)
    if key is None:
        return _inspect_kwargs(fn)
    try:
        return _KWARGS_CACHE[key]
    except KeyError:
        accepted = _KWARGS_CACHE[key] = _inspect_kwargs(fn)
        return accepted


_KWARGS_CACHE: weakref.WeakKeyDictionary[Any, set[str] | None] = weakref.WeakKeyDictionary()


def _inspect_kwargs(fn: Callable[..., Any]) -> set[str] | None:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
