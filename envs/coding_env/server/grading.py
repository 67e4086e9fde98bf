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
    """Run ``task.tests`` against ``code``; the run's result and one outcome per test.

    The solution's output past ``max_output_bytes`` is discarded, not a reason
    to stop it: a solution is graded on what it computes, however much it prints.
    """
    # The report comes on the run's channel, not stdout, so no amount of printing
    # can bury it; the nonce is what sets it apart from anything else sent there.
    # Unknown to the solution (the grader deletes tests.json before loading it),
    # so it cannot pass something of its own for the report.
    nonce = f"@@report-{secrets.token_hex(16)}@@"
    config = {"tests": task.tests, "per_test_seconds": per_test_seconds, "nonce": nonce}
    files = {"solution.py": code, "grader.py": _GRADER, "tests.json": json.dumps(config)}
    execution, channel = await sandbox.run_with_channel(files, "grader.py", kill_on_flood=False)
    outcomes = _parse_report(channel, nonce, task.tests)
    if not outcomes:
        error = f"no test report: {execution.message}"
        outcomes = [TestOutcome(test=test, passed=False, error=error) for test in task.tests]
    return execution, outcomes


def _parse_report(channel: bytes, nonce: str, tests: list[str]) -> list[TestOutcome]:
    """The outcomes on the line that carries ``nonce``; none if there is no such line."""
    _, found, rest = channel.partition(b"\n" + nonce.encode())
    if not found:
        return []
    try:
        raw = json.loads(rest.partition(b"\n")[0])
        return [
            TestOutcome(test=test, passed=item["passed"] is True, error=item["error"])
            for test, item in zip(tests, raw, strict=True)
        ]
    except (ValueError, TypeError, KeyError):
        return []
