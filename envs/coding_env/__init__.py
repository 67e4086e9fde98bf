"""The coding environment: run Python in a sandbox and grade it with unit tests."""

from coding_env.client import CodingEnv
from coding_env.models import (
    CodeAction,
    CodeObservation,
    CodingState,
    CodingTask,
    ExecutionResult,
    TestOutcome,
)

__all__ = [
    "CodeAction",
    "CodeObservation",
    "CodingEnv",
    "CodingState",
    "CodingTask",
    "ExecutionResult",
    "TestOutcome",
]
