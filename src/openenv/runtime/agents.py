"""Agents: what plays a task.

Two shapes are accepted, and the runtime tells them apart by ``act``:

- a function, ``async def agent(session) -> Any``, that drives the session
  itself (``reset``, ``step``, ``state``) and returns anything;
- an object with ``act(observation) -> action`` (sync or async), for which the
  runtime runs the loop: ``reset``, then ``act`` and ``step`` until ``done`` or
  the task's ``max_steps``. Its value is the final observation, as a dict.

A sync ``act`` runs in a thread, so that one that blocks (a model call, a
``time.sleep``) neither stalls the other episodes of its worker nor outlives
its task's timeout (its thread is left to finish on its own). An agent whose
sync ``act`` is quick and never blocks may set ``quick_act = True`` to run on
the event loop instead, saving the thread hop (``RandomAgent`` does).

An ``act`` agent may also define ``for_episode(session)`` returning the agent
to use for that episode, for per-episode state (``RandomAgent`` uses it to
fetch the action schema and seed its generator).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from openenv.runtime.session import EpisodeSession

__all__ = ["Agent", "AgentFunction", "drive", "is_session_agent"]

AgentFunction = Callable[["EpisodeSession"], Awaitable[Any]]


@runtime_checkable
class Agent(Protocol):
    """Anything with ``act(observation) -> action``; ``act`` may be ``async def``.

    >>> class Shout:
    ...     def act(self, observation):
    ...         return {"message": observation.echoed_message.upper() or "HI"}
    >>> isinstance(Shout(), Agent)
    True
    """

    def act(self, observation: Any) -> Any: ...


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def is_session_agent(agent: Any) -> bool:
    """Whether ``agent`` is ``async def agent(session)``, rather than a function of an observation.

    Told by the name (``session``) or annotation (``EpisodeSession``) of its
    first parameter, since both kinds are callables of one argument.

    >>> async def play(session): ...
    >>> async def act(observation): ...
    >>> is_session_agent(play), is_session_agent(act)
    (True, False)
    """
    if callable(getattr(agent, "act", None)) or not callable(agent):
        return False
    try:
        parameters = list(inspect.signature(agent).parameters.values())
    except (TypeError, ValueError):
        return False
    if not parameters:
        return False
    first = parameters[0]
    annotation = first.annotation
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return first.name == "session" or name.rpartition(".")[2] == "EpisodeSession"


async def drive(agent: Any, session: EpisodeSession) -> Any:
    """Play one episode with ``agent``; return the agent's value."""
    if getattr(agent, "drives_session", False):
        return await agent(session)
    if callable(getattr(agent, "act", None)):
        return await _act_loop(agent, session)
    outcome = agent(session)
    if not inspect.isawaitable(outcome):
        raise TypeError(
            f"the agent {getattr(agent, '__name__', type(agent).__name__)} returned "
            f"{type(outcome).__name__} instead of an awaitable; define it as "
            f"`async def agent(session)`, or give it an act(observation) method"
        )
    return await outcome


async def _act_loop(agent: Any, session: EpisodeSession) -> Any:
    for_episode = getattr(agent, "for_episode", None)
    if callable(for_episode):
        agent = await _maybe_await(for_episode(session))
    result = await session.reset()
    limit = session.max_steps
    while not result.done and (limit is None or session.steps < limit):
        action = await _call_act(agent, result.observation, session)
        result = await session.step(action)
    return result.observation.model_dump(mode="json")


async def _call_act(agent: Any, observation: Any, session: EpisodeSession) -> Any:
    act = agent.act
    if inspect.iscoroutinefunction(act) or getattr(agent, "quick_act", False):
        return await _maybe_await(act(observation))
    loop = asyncio.get_running_loop()
    return await _maybe_await(await loop.run_in_executor(session.threads, act, observation))
