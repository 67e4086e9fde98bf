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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from openenv.runtime.session import EpisodeSession

__all__ = ["Agent", "AgentFunction", "ParallelizableAgent", "drive"]

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


async def drive(agent: Any, session: EpisodeSession) -> Any:
    """Play one episode with ``agent``; return the agent's value."""
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


class ParallelizableAgent:
    """Run several agents on the same observation at once; combine what they propose.

    Sub-agents are ``act`` agents or plain callables of the observation, sync
    or async; sync ones run in threads so that they, too, run concurrently.

    Args:
        agents: The sub-agents, as a list or as a mapping of name to agent.
        aggregate_func: Turns ``{name: output}`` into the action to take (or
            the value to return); may be async. Default: the dict itself.

    >>> import asyncio
    >>> class Say:
    ...     def __init__(self, word):
    ...         self.word = word
    ...     def act(self, observation):
    ...         return self.word
    >>> both = ParallelizableAgent({"a": Say("hi"), "b": Say("ho")})
    >>> asyncio.run(both.act(None))
    {'a': 'hi', 'b': 'ho'}
    >>> joined = ParallelizableAgent([Say("hi"), Say("ho")],
    ...                              aggregate_func=lambda out: {"message": " ".join(out.values())})
    >>> asyncio.run(joined.act(None))
    {'message': 'hi ho'}
    """

    def __init__(
        self,
        agents: Sequence[Any] | Mapping[str, Any],
        aggregate_func: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        named = dict(agents) if isinstance(agents, Mapping) else _name_agents(agents)
        if not named:
            raise ValueError("ParallelizableAgent needs at least one agent")
        for name, agent in named.items():
            if not callable(getattr(agent, "act", None)) and not callable(agent):
                raise TypeError(
                    f"sub-agent {name!r} is neither an act() agent nor callable: "
                    f"{type(agent).__name__}"
                )
        self.agents = named
        self.aggregate_func = aggregate_func

    async def for_episode(self, session: EpisodeSession) -> ParallelizableAgent:
        """Bind every sub-agent that keeps per-episode state to this episode."""
        bound: dict[str, Any] = {}
        for name, agent in self.agents.items():
            for_episode = getattr(agent, "for_episode", None)
            bound[name] = await _maybe_await(for_episode(session)) if for_episode else agent
        return ParallelizableAgent(bound, self.aggregate_func)

    async def act(self, observation: Any) -> Any:
        outputs = await asyncio.gather(*(_call(a, observation) for a in self.agents.values()))
        combined = dict(zip(self.agents, outputs, strict=True))
        if self.aggregate_func is None:
            return combined
        return await _maybe_await(self.aggregate_func(combined))


async def _call(agent: Any, observation: Any) -> Any:
    fn = agent.act if callable(getattr(agent, "act", None)) else agent
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with `async def __call__`
    ):
        return await fn(observation)
    return await _maybe_await(await asyncio.to_thread(fn, observation))


def _name_agents(agents: Sequence[Any]) -> dict[str, Any]:
    named: dict[str, Any] = {}
    for agent in agents:
        base = getattr(agent, "name", None) or getattr(agent, "__name__", None)
        base = base if isinstance(base, str) else type(agent).__name__
        name, n = base, 1
        while name in named:
            n += 1
            name = f"{base}_{n}"
        named[name] = agent
    return named
