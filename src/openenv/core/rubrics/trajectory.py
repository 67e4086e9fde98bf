"""``openenv.core.rubrics.trajectory``: OpenEnv 0.10's trajectory rubrics, on openenv's.

>>> from openenv.core.env_server.types import Observation
>>> class WinLoss(ExponentialDiscountingTrajectoryRubric):
...     def score_trajectory(self, trajectory):
...         return trajectory[-1][1].metadata["outcome"]
>>> rubric = WinLoss(gamma=0.5, intermediate_reward=0.1)
>>> rubric(None, Observation()), rubric(None, Observation(done=True, metadata={"outcome": 1.0}))
(0.1, 1.0)
>>> rubric.compute_step_rewards()
[0.5, 1.0]
>>> rubric.reset(); rubric.trajectory
[]
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from openenv.rubrics import TrajectoryRubric as _TrajectoryRubric

__all__ = ["ExponentialDiscountingTrajectoryRubric", "TrajectoryRubric"]


class TrajectoryRubric(_TrajectoryRubric):
    """OpenEnv's: ``intermediate_reward`` on every step, then ``score_trajectory`` at the end."""

    def __init__(self, intermediate_reward: float = 0.0) -> None:
        super().__init__()
        self.intermediate_reward = intermediate_reward

    def forward(self, action: Any, observation: Any) -> float | Awaitable[float]:
        self.steps.append((action, observation))
        if getattr(observation, "done", False):
            return self.score_trajectory(self.steps)
        return self.intermediate_reward

    def compute_step_rewards(self) -> list[float]:
        """Each step's reward, once the episode has ended (subclasses say how)."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_step_rewards()")

    @property
    def trajectory(self) -> list[tuple[Any, Any]]:
        """The episode's ``(action, observation)`` pairs so far (a copy)."""
        return list(self.steps)

    # OpenEnv's subclasses read and assign the steps under this name.
    @property
    def _trajectory(self) -> list[tuple[Any, Any]]:
        return self.steps

    @_trajectory.setter
    def _trajectory(self, steps: list[tuple[Any, Any]]) -> None:
        self.steps = list(steps)

    def state_dict(self) -> dict[str, Any]:
        return {"intermediate_reward": self.intermediate_reward}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.intermediate_reward = state.get("intermediate_reward", self.intermediate_reward)


class ExponentialDiscountingTrajectoryRubric(TrajectoryRubric):
    """OpenEnv's: step ``t`` of ``T`` is worth ``gamma ** (T - 1 - t)`` of the final score."""

    def __init__(self, gamma: float = 0.99, intermediate_reward: float = 0.0) -> None:
        super().__init__(intermediate_reward)
        self.gamma = gamma

    def compute_step_rewards(self) -> list[float]:
        if not self.steps:
            return []
        final = float(self.score_trajectory(self.steps))  # type: ignore[arg-type]
        count = len(self.steps)
        return [final * self.gamma ** (count - 1 - t) for t in range(count)]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "gamma": self.gamma}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.gamma = state.get("gamma", self.gamma)
