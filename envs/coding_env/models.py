"""What the coding environment's agents send and receive."""

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from openenv import Action, Observation, State, TaskSpec

Status = Literal[
    "ok", "error", "syntax_error", "timeout", "cpu_limit", "memory_limit", "output_limit"
]


# Python source: the schema says so (contentMediaType), so forms offer a text area.
PythonSource = Annotated[str, Field(json_schema_extra={"contentMediaType": "text/x-python"})]


class CodingTask(TaskSpec):
    """Write ``entry_point`` as ``prompt`` asks; ``tests`` are Python statements that check it."""

    prompt: str = Field(description="What to write, for the agent.")
    entry_point: str = Field(description="The function the tests call.")
    tests: list[str] = Field(
        min_length=1, description="Each a Python statement (an assert) run against the solution."
    )


class CodeAction(Action):
    """Python source to run; with ``submit`` it is graded against the task's tests."""

    code: PythonSource = Field(max_length=100_000, description="A Python program (stdlib only).")
    submit: bool = Field(
        default=False, description="Grade it against the task's tests and end the episode."
    )


class ExecutionResult(BaseModel):
    """How one run of a program ended, and what it wrote.

    ``status`` is ``ok`` (exit code 0), ``error`` (another exit code, or a
    signal), ``syntax_error`` (the program did not compile), ``timeout`` (it
    ran past the wall-clock limit and was killed), ``cpu_limit`` (it used up
    its CPU seconds), ``memory_limit`` (it died of ``MemoryError`` under the
    address-space limit) or ``output_limit`` (it wrote more than the limit to
    stdout or stderr and was killed). ``exit_code`` is negative when a signal
    ended it (``-9``: killed), ``None`` when it never ran.
    """

    status: Status
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    message: str = Field(default="", description="One line saying how the run ended.")


class TestOutcome(BaseModel):
    """One test of a submission."""

    __test__ = False  # not a pytest test class

    test: str
    passed: bool
    error: str | None = None


class CodeObservation(Observation):
    """The task's prompt, then the result of the last run or submission."""

    prompt: str = ""
    execution: ExecutionResult | None = None
    tests: list[TestOutcome] = Field(default_factory=list, description="Set on submit.")
    tests_passed: int = 0
    tests_total: int = 0


class CodingState(State):
    """The episode's task, how many programs ran, and whether it was submitted."""

    task_id: str | None = None
    runs: int = 0
    done: bool = Field(default=False, description="Whether a submission ended the episode.")
