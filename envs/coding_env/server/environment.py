"""The coding environment itself: tasks, runs and submissions."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coding_env.models import (
    CodeAction,
    CodeObservation,
    CodingState,
    CodingTask,
    ExecutionResult,
    PythonSource,
    TestOutcome,
)
from coding_env.server.grading import grade
from coding_env.server.sandbox import Sandbox, SandboxLimits
from openenv import EnvError, Environment, JsonContent, TextContent, ToolOutput, tool

__all__ = ["CodingEnvironment", "load_split"]

_DATA = Path(__file__).parent / "data"
SPLITS = ("train", "test")


@functools.cache
def load_split(split: str) -> tuple[CodingTask, ...]:
    """The tasks of ``split``, shipped with the package in ``data/{split}.json``.

    >>> [task.id for task in load_split("test")][:2]
    ['test-gcd', 'test-roman']
    """
    raw = json.loads((_DATA / f"{split}.json").read_text(encoding="utf-8"))
    return tuple(CodingTask.model_validate(item) for item in raw)


class CodingEnvironment(Environment[CodeAction, CodeObservation, CodingState]):
    """Write a function that passes a task's unit tests; reward = the fraction that pass.

    ``step(CodeAction(code))`` (or the ``run_code`` tool) runs a program and
    shows what it printed; ``submit=True`` (or the ``submit`` tool) grades it
    and ends the episode. Programs run in a sandboxed process (see
    ``sandbox.py``), so the server's event loop never waits on them.

    >>> import asyncio
    >>> env = CodingEnvironment(SandboxLimits(timeout=5))
    >>> _ = asyncio.run(env.reset(task=load_split("train")[0]))
    >>> obs = asyncio.run(env.step(CodeAction(code="def add(a, b):\\n    return a + b",
    ...                                       submit=True)))
    >>> obs.reward, obs.done, obs.tests_passed, obs.tests_total
    (1.0, True, 3, 3)
    """

    # Instances share nothing but the pool of sandbox uids, which is locked.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, limits: SandboxLimits | None = None, per_test_seconds: float = 2.0):
        """``per_test_seconds`` is CPU time; ``limits.timeout`` bounds a whole submission."""
        self.sandbox = Sandbox(limits)
        self.per_test_seconds = per_test_seconds
        self._task = load_split("train")[0]
        self._state = CodingState(episode_id=uuid.uuid4().hex, task_id=self._task.id)

    @classmethod
    def list_splits(cls) -> Sequence[str]:
        return SPLITS

    @classmethod
    def list_tasks(cls, split: str) -> Sequence[CodingTask]:
        return load_split(split)

    @classmethod
    def get_prompt(cls, task: CodingTask) -> str:  # type: ignore[override]
        return (
            f"{task.prompt}\n\nSubmit Python source that defines `{task.entry_point}`; only "
            f"the standard library is available. It is graded by {len(task.tests)} tests."
        )

    async def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task: CodingTask | None = None,
        **kwargs: Any,
    ) -> CodeObservation:
        """A new episode for ``task``; without one, the ``seed``-th training task."""
        train = load_split("train")
        self._task = task or train[(seed or 0) % len(train)]
        self._state = CodingState(episode_id=episode_id or uuid.uuid4().hex, task_id=self._task.id)
        return CodeObservation(prompt=self.get_prompt(self._task))

    async def step(self, action: CodeAction, **kwargs: Any) -> CodeObservation:
        if action.submit:
            execution, outcomes = await self._submit(action.code)
            passed = sum(outcome.passed for outcome in outcomes)
            return CodeObservation(
                prompt=self.get_prompt(self._task),
                execution=execution,
                tests=outcomes,
                tests_passed=passed,
                tests_total=len(outcomes),
                reward=passed / len(outcomes),
                done=True,
            )
        execution = await self._run(action.code)
        return CodeObservation(prompt=self.get_prompt(self._task), execution=execution)

    @property
    def state(self) -> CodingState:
        return self._state

    @tool
    async def run_code(self, code: PythonSource) -> ToolOutput:
        """Run a Python program and see its exit status, stdout and stderr.

        Args:
            code: The program's source (standard library only).
        """
        execution = await self._run(code)
        return ToolOutput(
            content=[
                TextContent(text=_describe(execution)),
                JsonContent(data=execution.model_dump()),
            ]
        )

    @tool
    async def submit(self, code: PythonSource) -> ToolOutput:
        """Grade a solution with the task's tests and end the episode; reward = fraction passed.

        Args:
            code: Python source defining the function the task asks for.
        """
        execution, outcomes = await self._submit(code)
        passed = sum(outcome.passed for outcome in outcomes)
        lines = [f"{passed}/{len(outcomes)} tests passed"]
        lines += [f"FAILED {o.test}: {o.error}" for o in outcomes if not o.passed]
        return ToolOutput(
            content=[
                TextContent(text="\n".join(lines)),
                JsonContent(
                    data={
                        "execution": execution.model_dump(),
                        "tests": [outcome.model_dump() for outcome in outcomes],
                    }
                ),
            ],
            reward=passed / len(outcomes),
            finished=True,
        )

    async def _run(self, code: str) -> ExecutionResult:
        self._check_open()
        self._state.step_count += 1
        self._state.runs += 1
        return await self.sandbox.run_code(code)

    async def _submit(self, code: str) -> tuple[ExecutionResult, list[TestOutcome]]:
        self._check_open()
        self._state.step_count += 1
        self._state.done = True
        return await grade(self.sandbox, self._task, code, self.per_test_seconds)

    def _check_open(self) -> None:
        if self._state.done:
            raise EnvError("the episode is over (a solution was submitted); reset() first")


def _describe(execution: ExecutionResult) -> str:
    parts = [f"{execution.status}: {execution.message}"]
    for name, text, cut in (
        ("stdout", execution.stdout, execution.stdout_truncated),
        ("stderr", execution.stderr, execution.stderr_truncated),
    ):
        if text:
            parts.append(f"--- {name}{' (truncated)' if cut else ''} ---\n{text.rstrip()}")
    return "\n".join(parts)
