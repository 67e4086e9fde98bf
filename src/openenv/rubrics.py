"""Rubrics: rewards built from named parts, each part reported beside the total.

A ``Rubric`` scores one step from its action and observation (``forward``,
``def`` or ``async def``). Rubrics assigned as attributes of another become
its named parts; containers combine parts by weight (``WeightedSum``), by
threshold (``Gate``), fail-fast in order (``Sequential``) or by the best
(``Max``). A ``TrajectoryRubric`` scores a whole episode when it ends.

``await rubric.evaluate(action, observation)`` scores every part, the
``async`` ones (an LLM judge, a sandbox run) concurrently; ``rubric(action,
observation)`` does the same from a plain ``def step``. ``rubric.annotate(obs)``
then writes the total into ``obs.reward`` and every part's score into
``obs.metadata["reward_parts"]``, which clients, recorded trajectories and
reports read. A part that raises scores 0 and its error is reported in
``obs.metadata["reward_errors"]`` (and logged), never swallowed silently.

>>> class Solved(Rubric):
...     def forward(self, action, observation):
...         return 1.0 if observation.done else 0.0
>>> class Short(Rubric):
...     def forward(self, action, observation):
...         return 1.0 if len(action.text) <= 5 else 0.0
>>> from openenv import Action, Observation
>>> class Say(Action):
...     text: str
>>> rubric = WeightedSum({"solved": Solved(), "short": Short()}, weights=[0.8, 0.2])
>>> observation = Observation(done=True)
>>> rubric(Say(text="hello, world"), observation)
0.8
>>> rubric.annotate(observation).metadata["reward_parts"]
{'solved': 1.0, 'short': 0.0}
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["Gate", "Max", "Rubric", "Sequential", "TrajectoryRubric", "WeightedSum"]

logger = logging.getLogger("openenv.rubrics")


class Rubric:
    """A reward over one step; subclass it and implement ``forward``.

    Child rubrics assigned as attributes (``self.syntax = Compiles()``) are
    its parts, named by the attribute, and scored when it is.
    """

    def __init__(self) -> None:
        self._parts: dict[str, Rubric] = {}
        self.last_score: float | None = None
        self.last_error: str | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Rubric) and not name.startswith("_"):
            self.__dict__.setdefault("_parts", {})[name] = value
        object.__setattr__(self, name, value)

    def forward(self, action: Any, observation: Any) -> float | Awaitable[float]:
        """The score of one step. ``async def`` is fine: parts run concurrently."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    async def evaluate(self, action: Any, observation: Any) -> float:
        """Score the step (``async`` parts concurrently); a part that raises scores 0."""
        return self._settle(await self._attempt_async(action, observation))

    def __call__(self, action: Any, observation: Any) -> float:
        """Score the step from plain code, such as a ``def step``.

        Parts that are all plain ``def`` run right here, even on an event
        loop's thread; an ``async`` part needs ``await rubric.evaluate(...)``
        there (and runs in ``asyncio.run`` where no loop is running).
        """
        return self._settle(self._attempt(action, observation))

    def parts(self) -> Iterator[tuple[str, Rubric]]:
        """Every part below this rubric, depth first, with dotted names."""
        for name, part in self._parts.items():
            yield name, part
            for sub, below in part.parts():
                yield f"{name}.{sub}", below

    def annotate(self, observation: Any) -> Any:
        """Write the last total and every part's score into ``observation``; return it."""
        observation.reward = self.last_score
        observation.metadata["reward_parts"] = {n: p.last_score for n, p in self.parts()}
        errors = {n: p.last_error for n, p in self.parts() if p.last_error is not None}
        if self.last_error is not None:
            errors[""] = self.last_error
        if errors:
            observation.metadata["reward_errors"] = errors
        return observation

    def reset(self) -> None:
        """Forget what was scored (a new episode); trajectory rubrics clear their steps."""
        for rubric in (self, *(part for _, part in self.parts())):
            rubric.last_score = rubric.last_error = None
            if isinstance(rubric, TrajectoryRubric):
                rubric.steps.clear()

    def _attempt(self, action: Any, observation: Any) -> float | BaseException:
        try:
            result = self.forward(action, observation)
            if inspect.isawaitable(result):
                result = _run_here(result)
            return float(result)
        except _NeedsLoop:
            raise
        except Exception as exc:
            return exc

    async def _attempt_async(self, action: Any, observation: Any) -> float | BaseException:
        try:
            result = self.forward(action, observation)
            if inspect.isawaitable(result):
                result = await result
            return float(result)
        except Exception as exc:
            return exc

    def _settle(self, outcome: float | BaseException) -> float:
        if isinstance(outcome, BaseException):
            logger.error("rubric %s raised", type(self).__name__, exc_info=outcome)
            self.last_score, self.last_error = 0.0, f"{type(outcome).__name__}: {outcome}"
        else:
            self.last_score, self.last_error = outcome, None
        return self.last_score


class _Combined(Rubric):
    """Parts given as a mapping (their names) or a sequence (``part0``, ``part1``, ...).

    A container combines its parts' scores with ``combine``; it scores the
    parts itself, so a tree of plain ``def`` parts needs no event loop.
    """

    def __init__(self, parts: Mapping[str, Rubric] | Sequence[Rubric]) -> None:
        super().__init__()
        named = parts.items() if isinstance(parts, Mapping) else _numbered(parts)
        for name, part in named:
            setattr(self, name, part)
        if not self._parts:
            raise ValueError(f"{type(self).__name__} needs at least one part")

    def combine(self, scores: list[float]) -> float:
        raise NotImplementedError

    def _attempt(self, action: Any, observation: Any) -> float | BaseException:
        scores = [part(action, observation) for part in self._parts.values()]
        return self.combine(scores)

    async def _attempt_async(self, action: Any, observation: Any) -> float | BaseException:
        parts = self._parts.values()
        scores = await asyncio.gather(*(part.evaluate(action, observation) for part in parts))
        return self.combine(list(scores))


class WeightedSum(_Combined):
    """The weighted sum of its parts' scores (weights in the parts' order, or by name)."""

    def __init__(
        self,
        parts: Mapping[str, Rubric] | Sequence[Rubric],
        weights: Sequence[float] | Mapping[str, float],
    ) -> None:
        super().__init__(parts)
        if isinstance(weights, Mapping):
            weights = [weights[name] for name in self._parts]
        if len(weights) != len(self._parts):
            raise ValueError(f"{len(self._parts)} parts but {len(weights)} weights")
        self.weights = [float(w) for w in weights]

    def combine(self, scores: list[float]) -> float:
        return sum(w * s for w, s in zip(self.weights, scores, strict=True))


class Max(_Combined):
    """The best of its parts' scores."""

    def combine(self, scores: list[float]) -> float:
        return max(scores)


class Gate(_Combined):
    """Its part's score when it reaches ``threshold``, else 0."""

    def __init__(self, part: Rubric, threshold: float = 1.0) -> None:
        super().__init__({"part": part})
        self.threshold = threshold

    def combine(self, scores: list[float]) -> float:
        return scores[0] if scores[0] >= self.threshold else 0.0


class Sequential(_Combined):
    """Parts in order; 0 as soon as one scores 0, else the last part's score.

    Later parts are not scored after a zero (a slow judge never runs on code
    that does not compile).
    """

    def __init__(self, *parts: Rubric) -> None:
        super().__init__(parts)

    def _attempt(self, action: Any, observation: Any) -> float | BaseException:
        score = 0.0
        parts = list(self._parts.values())
        for i, part in enumerate(parts):
            if (score := part(action, observation)) == 0:
                _unscored(parts[i + 1 :])
                return 0.0
        return score

    async def _attempt_async(self, action: Any, observation: Any) -> float | BaseException:
        score = 0.0
        parts = list(self._parts.values())
        for i, part in enumerate(parts):
            if (score := await part.evaluate(action, observation)) == 0:
                _unscored(parts[i + 1 :])
                return 0.0
        return score


def _unscored(parts: list[Rubric]) -> None:
    """Parts skipped this step report no score (``None``), not an earlier step's."""
    for part in parts:
        for rubric in (part, *(below for _, below in part.parts())):
            rubric.last_score = rubric.last_error = None


class TrajectoryRubric(Rubric):
    """Scores a whole episode: 0 on every step, then ``score_trajectory`` when it ends.

    ``steps`` holds every ``(action, observation)`` of the episode so far.
    """

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[Any, Any]] = []

    def score_trajectory(self, steps: list[tuple[Any, Any]]) -> float | Awaitable[float]:
        raise NotImplementedError(f"{type(self).__name__} must implement score_trajectory()")

    def forward(self, action: Any, observation: Any) -> float | Awaitable[float]:
        self.steps.append((action, observation))
        if not getattr(observation, "done", False):
            return 0.0
        return self.score_trajectory(self.steps)


class _NeedsLoop(RuntimeError):
    pass


def _run_here(awaitable: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(awaitable))
    if inspect.iscoroutine(awaitable):
        awaitable.close()
    raise _NeedsLoop(
        "an async rubric part scored from an event loop's thread: use `await rubric.evaluate(...)`"
    )


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _numbered(parts: Sequence[Rubric]) -> Iterator[tuple[str, Rubric]]:
    for i, part in enumerate(parts):
        yield f"part{i}", part
