"""Wordle: guess a five-letter word in six tries, with per-letter feedback."""

from wordle_env.client import WordleEnv
from wordle_env.models import (
    GuessFeedback,
    WordleAction,
    WordleObservation,
    WordleState,
    WordleTask,
)

__all__ = [
    "GuessFeedback",
    "WordleAction",
    "WordleEnv",
    "WordleObservation",
    "WordleState",
    "WordleTask",
]
