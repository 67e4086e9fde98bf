"""``openenv.core.rubrics.base``: OpenEnv 0.10's ``Rubric``, which is openenv's."""

from __future__ import annotations

from openenv.rubrics import Rubric

__all__ = ["Rubric"]
