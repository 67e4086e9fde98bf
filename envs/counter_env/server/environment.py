"""The counter environment itself."""

import uuid
from collections.abc import Sequence
from typing import Any, overload

from counter_env.models import CounterAction, CounterObservation, CounterState, CounterTask
from openenv import EnvError, Environment, TextContent, ToolOutput, tool


class Split(Sequence[CounterTask]):
    """A split whose tasks are computed when read, as a large one would be."""

    def __init__(self, name: str, size: int, salt: int) -> None:
        self.name, self.size, self.salt = name, size, salt

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> CounterTask: ...
    @overload
    def __getitem__(self, index: slice) -> list[CounterTask]: ...
    def __getitem__(self, index: int | slice) -> CounterTask | list[CounterTask]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.size))]
        if not -self.size <= index < self.size:
            raise IndexError(f"{self.name} has {self.size} tasks")
        index %= self.size
        return CounterTask(id=f"{self.name}-{index}", target=(index * 7 + self.salt) % 10 + 1)


SPLITS = {"train": Split("train", 1000, 3), "test": Split("test", 100, 5)}
# The counter's range: a signed 64-bit integer, what a JSON reply carries exactly.
_LOWEST, _HIGHEST = -(2**63), 2**63 - 1


class CounterEnvironment(Environment[CounterAction, CounterObservation, CounterState]):
    """Count to a target with tools, then submit; reward 1.0 for hitting it exactly.

    >>> env = CounterEnvironment()
    >>> env.reset(task=CounterTask(id="t", target=2)).target
    2
    >>> env.increment(2)
    {'value': 2}
    >>> env.submit().reward
    1.0
    """

    # Instances share nothing, so one process may hold many of them.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = CounterState(episode_id=uuid.uuid4().hex, target=SPLITS["train"][0].target)

    @classmethod
    def list_splits(cls) -> Sequence[str]:
        return tuple(SPLITS)

    @classmethod
    def list_tasks(cls, split: str) -> Sequence[CounterTask]:
        return SPLITS[split]

    @classmethod
    def get_prompt(cls, task: CounterTask) -> str:  # type: ignore[override]
        return (
            f"The counter starts at 0. Use increment(amount) to make it exactly "
            f"{task.target}, then call submit()."
        )

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task: CounterTask | None = None,
        **kwargs: Any,
    ) -> CounterObservation:
        """A new episode for ``task``; without one, the ``seed``-th training task."""
        task = task or SPLITS["train"][(seed or 0) % len(SPLITS["train"])]
        self._state = CounterState(episode_id=episode_id or uuid.uuid4().hex, target=task.target)
        return CounterObservation(value=0, target=task.target)

    def step(self, action: CounterAction, **kwargs: Any) -> CounterObservation:
        # The server refuses tools once submit() has ended the episode, not plain steps.
        if self._state.done:
            raise EnvError("the episode is over (submit() ended it); reset() to start another")
        self.increment(action.amount)
        return CounterObservation(value=self._state.value, target=self._state.target)

    @property
    def state(self) -> CounterState:
        return self._state

    @tool
    def increment(self, amount: int) -> dict[str, int]:
        """Add to the counter and return its new value.

        Args:
            amount: How much to add; may be negative.
        """
        value = self._state.value + amount
        if not _LOWEST <= value <= _HIGHEST:
            # Past 64 bits no reply can carry the counter: a step would end the
            # session, and every later reply (the state's too) would fail.
            raise EnvError(
                f"the counter would be {value}, outside the 64-bit integers replies carry; "
                f"it stays {self._state.value}"
            )
        self._state.value = value
        self._state.step_count += 1
        return {"value": value}

    @tool
    async def get_value(self) -> int:
        """The counter's current value."""
        return self._state.value

    @tool
    def submit(self) -> ToolOutput:
        """End the episode: reward 1.0 if the counter equals the target, else 0.0."""
        self._state.step_count += 1
        self._state.done = True
        value, target = self._state.value, self._state.target
        if value == target:
            return ToolOutput(content=[TextContent(text="correct")], reward=1.0, finished=True)
        text = f"wrong: the counter is {value}, the target was {target}"
        return ToolOutput(content=[TextContent(text=text)], reward=0.0, finished=True)
