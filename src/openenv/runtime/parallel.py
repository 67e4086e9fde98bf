"""``ParallelizableAgent``: several agents at once, their outputs combined (AWorld's spelling)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from openenv.runtime.agents import drive, is_session_agent

if TYPE_CHECKING:
    from openenv.runtime.session import EpisodeSession

__all__ = ["ParallelizableAgent"]


class ParallelizableAgent:
    """Run several agents at once; combine what they produce.

    Two ways, chosen by the sub-agents:

    - observation agents (``act`` agents, or plain callables of the
      observation, sync or async): at every step each proposes an action for
      the same observation, at once (sync ones in threads), and
      ``aggregate_func`` picks the action taken;
    - session agents (``async def agent(session)``; any sub-agent of this
      kind switches the whole agent to it): each plays its own episode of the
      task, on its own session, at once, and ``aggregate_func`` turns their
      values into the task's value (say, the best of N). Observation agents
      among them play their episode with the usual ``act`` loop. The task's
      ``steps`` and ``reward`` add up every sub-episode.

    Args:
        agents: The sub-agents, as a list or as a mapping of name to agent.
        aggregate_func: ``f(agent, results)`` as in AWorld (``agent`` is this
            ``ParallelizableAgent``), or ``f(results)``, where ``results`` is
            ``{name: output}``; may be async. Default: ``results`` itself.
            Any other signature fails here, not in every task.
        name: The agent's name (AWorld's ``name=``).

    >>> import asyncio
    >>> class Say:
    ...     def __init__(self, word):
    ...         self.word = word
    ...     def act(self, observation):
    ...         return self.word
    >>> both = ParallelizableAgent({"a": Say("hi"), "b": Say("ho")})
    >>> asyncio.run(both.act(None))
    {'a': 'hi', 'b': 'ho'}
    >>> def join(agent, results):
    ...     return {"message": " ".join(results.values())}
    >>> joined = ParallelizableAgent(name="both", agents=[Say("hi"), Say("ho")],
    ...                              aggregate_func=join)
    >>> asyncio.run(joined.act(None))
    {'message': 'hi ho'}
    """

    def __init__(
        self,
        agents: Sequence[Any] | Mapping[str, Any] | None = None,
        aggregate_func: Callable[..., Any] | None = None,
        *,
        name: str = "parallel",
    ) -> None:
        agents = agents if agents is not None else []
        named = dict(agents) if isinstance(agents, Mapping) else _name_agents(agents)
        if not named:
            raise ValueError("ParallelizableAgent needs at least one agent")
        for key, agent in named.items():
            if not callable(getattr(agent, "act", None)) and not callable(agent):
                raise TypeError(
                    f"sub-agent {key!r} is neither an act() agent nor callable: "
                    f"{type(agent).__name__}"
                )
        self.name = name
        self.agents = named
        self.aggregate_func = aggregate_func
        self._passes_agent = _passes_agent(aggregate_func) if aggregate_func else False
        # Any session agent among them: each sub-agent plays its own episode.
        self.drives_session = any(is_session_agent(a) for a in named.values())
        self._session: EpisodeSession | None = None  # set on the copy bound to an episode

    def __repr__(self) -> str:
        return f"ParallelizableAgent(name={self.name!r}, agents={list(self.agents)!r})"

    async def for_episode(self, session: EpisodeSession) -> ParallelizableAgent:
        """Bind every sub-agent that keeps per-episode state to this episode."""
        bound: dict[str, Any] = {}
        for key, agent in self.agents.items():
            for_episode = getattr(agent, "for_episode", None)
            bound[key] = await _maybe_await(for_episode(session)) if for_episode else agent
        bound_agent = self._with(bound)
        bound_agent._session = session
        return bound_agent

    async def act(self, observation: Any) -> Any:
        outputs = await _all([_call(a, observation, self._session) for a in self.agents.values()])
        return await self._aggregate(dict(zip(self.agents, outputs, strict=True)))

    async def __call__(self, session: EpisodeSession) -> Any:
        """Session mode: every sub-agent plays its own episode of the task, at once."""

        async def play(agent: Any) -> Any:
            async with session.fork() as own:
                return await drive(agent, own)

        outputs = await _all([play(a) for a in self.agents.values()])
        return await self._aggregate(dict(zip(self.agents, outputs, strict=True)))

    async def _aggregate(self, results: dict[str, Any]) -> Any:
        if self.aggregate_func is None:
            return results
        if self._passes_agent:
            return await _maybe_await(self.aggregate_func(self, results))
        return await _maybe_await(self.aggregate_func(results))

    def _with(self, agents: dict[str, Any]) -> ParallelizableAgent:
        return ParallelizableAgent(agents, self.aggregate_func, name=self.name)


async def _all(calls: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Their results; when one fails, the others are cancelled (gather leaves them
    running, past their task's end, holding their sessions) before it is raised."""
    running = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*running)
    except BaseException:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise


def _passes_agent(func: Callable[..., Any]) -> bool:
    """True for ``f(agent, results)``, False for ``f(results)``; anything else is refused."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return False  # a builtin: assume the plain form
    forms: tuple[tuple[Any, ...], ...] = ((None, {}), ({},))
    for args in forms:
        try:
            signature.bind(*args)
        except TypeError:
            continue
        return len(args) == 2
    raise TypeError(
        f"aggregate_func {getattr(func, '__name__', func)!r}{signature} cannot be called as "
        f"f(agent, results) nor as f(results); define it as "
        f"def aggregate(agent, results: dict) -> action"
    )


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _call(agent: Any, observation: Any, session: EpisodeSession | None) -> Any:
    fn = agent.act if callable(getattr(agent, "act", None)) else agent
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with `async def __call__`
    ):
        return await fn(observation)
    # The run's threads: a loop's default executor has a few, which sub-agents
    # stuck past their task's timeout would use up.
    threads = session.threads if session is not None else None
    loop = asyncio.get_running_loop()
    return await _maybe_await(await loop.run_in_executor(threads, fn, observation))


def _name_agents(agents: Sequence[Any]) -> dict[str, Any]:
    named: dict[str, Any] = {}
    for agent in agents:
        base = getattr(agent, "name", None) or getattr(agent, "__name__", None)
        base = base if isinstance(base, str) else type(agent).__name__
        key, n = base, 1
        while key in named:
            n += 1
            key = f"{base}_{n}"
        named[key] = agent
    return named
