"""Wordle's reward, as a rubric: each part is reported beside the total.

``solved`` is the reward (1 for the winning guess). ``greens``, the share of
letters in place in the latest guess, is reported with weight 0: a shaping
signal to log, or to train on by giving it weight.
"""

from __future__ import annotations

from typing import Any

from openenv import Rubric, WeightedSum

__all__ = ["Greens", "Solved", "wordle_rubric"]


class Solved(Rubric):
    """1 when the latest guess is the word."""

    def forward(self, action: Any, observation: Any) -> float:
        board = observation.board
        return 1.0 if board and board[-1].pattern == "GGGGG" else 0.0


class Greens(Rubric):
    """The share of the latest guess's letters that are in place."""

    def forward(self, action: Any, observation: Any) -> float:
        board = observation.board
        return board[-1].pattern.count("G") / len(board[-1].pattern) if board else 0.0


def wordle_rubric() -> WeightedSum:
    """A fresh rubric for one session.

    >>> rubric = wordle_rubric()
    >>> [name for name, _ in rubric.parts()]
    ['solved', 'greens']
    """
    return WeightedSum({"solved": Solved(), "greens": Greens()}, weights=[1.0, 0.0])
