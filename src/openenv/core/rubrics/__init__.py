"""``openenv.core.rubrics``: OpenEnv 0.10's rubric import paths, onto ``openenv.rubrics``.

What OpenEnv's environments import (``rubrics.base.Rubric``,
``rubrics.trajectory.ExponentialDiscountingTrajectoryRubric``): ``Rubric`` is
openenv's (subclass it, implement ``forward``); the trajectory rubrics keep
OpenEnv's constructor (``intermediate_reward=``, ``gamma=``) and methods
(``compute_step_rewards``, ``trajectory``, ``_trajectory``).
"""

from __future__ import annotations

from openenv.core.rubrics.base import Rubric
from openenv.core.rubrics.trajectory import (
    ExponentialDiscountingTrajectoryRubric,
    TrajectoryRubric,
)

__all__ = ["ExponentialDiscountingTrajectoryRubric", "Rubric", "TrajectoryRubric"]
