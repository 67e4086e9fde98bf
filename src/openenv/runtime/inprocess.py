"""Play a factory's environment in this process, with no server and no socket.

Requests go through the server's own ``Session`` (validation, error codes,
``def`` methods in threads), so an environment behaves exactly as it would
behind ``/ws``, and errors arrive as the same typed exceptions.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import typing
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from openenv import protocol
from openenv.client._base import ClientCore
from openenv.environment import Environment
from openenv.errors import FactoryError, SessionClosedError
from openenv.protocol import ErrorCode
from openenv.tasks import TaskSpec
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import Action, Observation, State, StepResult

if TYPE_CHECKING:
    from openenv.server.sessions import Session

__all__ = ["InProcessClient", "environment_models"]


class InProcessClient(ClientCore[Action, Observation, State]):
    """A client whose session lives in this process; made by the runtime for factory tasks."""

    def __init__(self, factory: Any, executor: Executor) -> None:
        self.factory = factory
        self.url = f"inprocess:{getattr(factory, '__qualname__', type(factory).__qualname__)}"
        self._executor = executor
        self._session: Session | None = None
        self._closed = False

    async def connect(self) -> InProcessClient:
        if self._session is not None:
            return self
        if self._closed:
            raise SessionClosedError("this client was closed; create a new one")
        # Imported here: the server's session logic is needed only once a
        # factory task runs, and the runtime's import path stays client-only.
        from openenv.server.sessions import Session

        env = await self._create()
        self.action_cls, self.observation_cls, self.state_cls = environment_models(type(env))
        self._session = Session(env, _host(self.action_cls, self._executor))
        return self

    async def _create(self) -> Environment[Any, Any, Any]:
        loop = asyncio.get_running_loop()
        try:
            env = await loop.run_in_executor(self._executor, self.factory)
            if inspect.isawaitable(env):
                env = await env
        except Exception as exc:
            raise FactoryError(
                ErrorCode.FACTORY_ERROR,
                f"could not create the environment: {type(exc).__name__}: {exc}",
            ) from exc
        if not isinstance(env, Environment):
            raise FactoryError(
                ErrorCode.FACTORY_ERROR,
                f"the environment factory returned {type(env).__name__}, expected an Environment",
            )
        return env

    async def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> StepResult[Observation]:
        data = self.encode_reset(seed, episode_id, kwargs)
        return self.decode_result(await self._request("reset", data))

    async def step(self, action: Action | dict[str, Any]) -> StepResult[Observation]:
        return self.decode_result(await self._request("step", self.encode_action(action)))

    async def state(self) -> State:
        return self.decode_state(await self._request("state"))

    async def list_tools(self) -> list[ToolInfo]:
        return self.decode_tools(await self._request("list_tools"))

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any] | BaseModel | None = None, **kwargs: Any
    ) -> ToolOutput:
        data = self.encode_tool_call(name, arguments, kwargs)
        return self.decode_tool_result(await self._request("call_tool", data))

    async def get_prompt(self, task: TaskSpec | None = None) -> str:
        data = {} if task is None else {"task": task.model_dump(mode="json")}
        return self.decode_prompt(await self._request("get_prompt", data))

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.aclose("client_close")

    async def _request(
        self,
        kind: Literal["reset", "step", "state", "list_tools", "call_tool", "get_prompt"],
        data: dict[str, Any] | None = None,
    ) -> str:
        await self.connect()
        if self._session is None:
            raise SessionClosedError("this client was closed; create a new one")
        frame = protocol.request_frame(kind, data)
        started = time.time()
        reply = await self._session.handle(frame)
        assert reply is not None  # only a `close` request has no reply
        if self.on_exchange is not None:
            self.on_exchange(frame, reply, started)
        return reply


def environment_models(
    env_cls: type[Environment[Any, Any, Any]],
) -> tuple[type[Action], type[Observation], type[State]]:
    """The action, observation and state models an environment class declares.

    >>> from echo_env.server.environment import EchoEnvironment
    >>> [m.__name__ for m in environment_models(EchoEnvironment)]
    ['EchoAction', 'EchoObservation', 'State']
    """
    for klass in inspect.getmro(env_cls):
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is not Environment:
                continue
            models = typing.get_args(base)
            roots = (Action, Observation, State)
            if len(models) == 3 and all(
                isinstance(m, type) and issubclass(m, r) for m, r in zip(models, roots, strict=True)
            ):
                return models[0], models[1], models[2]
    raise TypeError(
        f"{env_cls.__name__} does not declare its models, so its actions cannot be "
        f"validated in process; declare them as "
        f"class {env_cls.__name__}(Environment[MyAction, MyObservation, MyState])"
    )


def _host(action_cls: type[Action], executor: Executor) -> Any:
    """A one-slot stand-in for the server around an in-process session."""
    from openenv.server.calls import on_executor
    from openenv.server.config import ServerSettings
    from openenv.server.metrics import Metrics
    from openenv.server.slots import SessionRegistry

    run_on_executor = on_executor(executor)

    class Host:
        def __init__(self) -> None:
            self.action_cls = action_cls
            self.registry = SessionRegistry(1)
            self.registry.try_acquire()
            # Nothing crosses a trust boundary in-process: show the whole exception.
            self.settings = ServerSettings(api_key=None, error_details=True)
            self.metrics = Metrics(self.registry)
            self.handoff = self

        def submit(
            self,
            ticket: object,
            fn: Any,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            *,
            timed: bool = False,
        ) -> asyncio.Future[Any]:
            return run_on_executor(fn, args, kwargs)

        def dispatch(
            self,
            ticket: object,
            fn: Any,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            receiver: Any,
        ) -> None:
            def forward(future: asyncio.Future[Any]) -> None:
                if future.exception() is not None:
                    receiver.set_exception(future.exception())
                else:
                    receiver.set_result(future.result())

            run_on_executor(fn, args, kwargs).add_done_callback(forward)

    return Host()
