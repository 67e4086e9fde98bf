"""Grade a submission: run the task's tests against it in the sandbox.

>>> import asyncio
>>> from coding_env.models import CodingTask
>>> from coding_env.server.sandbox import Sandbox, SandboxLimits
>>> task = CodingTask(id="t", prompt="add", entry_point="add",
...                   tests=["assert add(1, 2) == 3", "assert add(2, 2) == 5"])
>>> execution, outcomes = asyncio.run(
...     grade(Sandbox(SandboxLimits(timeout=5)), task, "def add(a, b):\\n    return a + b\\n"))
>>> execution.status, [outcome.passed for outcome in outcomes]
('ok', [True, False])
>>> outcomes[1].error
'AssertionError'
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from coding_env.models import CodingTask, ExecutionResult, TestOutcome
from coding_env.server.sandbox import Sandbox

__all__ = ["grade"]

_GRADER = (Path(__file__).parent / "grader.py").read_text(encoding="utf-8")


async def grade(
    sandbox: Sandbox, task: CodingTask, code: str, per_test_seconds: float = 2.0
) -> tuple[ExecutionResult, list[TestOutcome]]:
    """Run ``task.tests`` against ``code``; the run's result and one outcome per test."""
    # Unknown to the solution (the grader deletes tests.json before loading it),
    # so its own prints cannot pass for the report.
    marker = f"@@report-{secrets.token_hex(16)}@@"
    config = {"tests": task.tests, "per_test_seconds": per_test_seconds, "marker": marker}
    files = {"solution.py": code, "grader.py": _GRADER, "tests.json": json.dumps(config)}
    execution = await sandbox.run(files, "grader.py")
    before, found, report = execution.stdout.rpartition("\n" + marker)
    outcomes: list[TestOutcome] = []
    if found:
        execution = execution.model_copy(update={"stdout": before})
        try:
            raw = json.loads(report)
            outcomes = [
                TestOutcome(test=test, passed=item["passed"] is True, error=item["error"])
                for test, item in zip(task.tests, raw, strict=True)
            ]
        except (ValueError, TypeError, KeyError):
            outcomes = []
    if not outcomes:
        error = f"no test report: {execution.message}"
        outcomes = [TestOutcome(test=test, passed=False, error=error) for test in task.tests]
    return execution, outcomes
