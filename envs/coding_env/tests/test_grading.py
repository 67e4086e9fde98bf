"""Grading against a real server: the report travels apart from what a solution prints.

A submission is graded on what it computes: its output past
``max_output_bytes`` is discarded, but the run goes on and the report, sent
on a channel of its own, arrives however much the solution printed. Nothing
the solution prints or writes (to any fd, or from programs it starts) can
pass for that report.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from coding_env import CodeAction, CodeObservation, CodingTask, ExecutionResult, TestOutcome
from coding_env.server.environment import CodingEnvironment, load_split
from coding_env.server.sandbox import SandboxLimits
from openenv import ConcurrencyConfig, RemoteEnv, create_app
from openenv.testing import run_server

LIMITS = SandboxLimits(
    timeout=60, cpu_seconds=30, memory_bytes=64 * 2**20, max_processes=8, max_output_bytes=4000
)
ROMAN = load_split("test")[1]  # to_roman, 3 tests
Graded = tuple[float, ExecutionResult, list[TestOutcome]]

CORRECT = """\
def to_roman(n):
    table = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),
             (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]
    out = ''
    for value, letters in table:
        while n >= value:
            out += letters
            n -= value
    return out
"""
# Right for 4 and 3999's shape but not 1994's: 2 of 3 tests pass.
PARTIAL = "def to_roman(n):\n    return {4: 'IV', 3999: 'MMMCMXCIX'}.get(n, '?')\n"

# Debug output as an LLM's solution prints it, far past 4000 bytes on both
# streams, through print, the raw fd and during the tests as well as before.
LOUD = """\
import os, sys
print('loading', 'x' * 100_000)
os.write(1, b'raw ' * 50_000)
sys.stderr.write('warning ' * 20_000)
_quiet = to_roman

def to_roman(n):
    for i in range(2_000):
        print('to_roman', n, 'step', i)
    return _quiet(n)
"""


# Wrong for 1994, with an exception that cannot be put into words: the other
# two tests are graded all the same.
UNSPEAKABLE = """\
class Unspeakable(Exception):
    def __str__(self):
        raise ValueError("no words")

_right = to_roman

def to_roman(n):
    if n == 1994:
        raise Unspeakable()
    return _right(n)
"""


def make_app(limits: SandboxLimits) -> FastAPI:
    env = functools.partial(CodingEnvironment, limits=limits)
    return create_app(env, CodeAction, CodeObservation, ConcurrencyConfig(max_concurrent_envs=16))


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with run_server(make_app(LIMITS)) as url:
        yield url


def submit_all(url: str, codes: list[str]) -> list[Graded]:
    async def one(code: str) -> Graded:
        env = RemoteEnv(url, task_cls=CodingTask)
        async with env.session(ROMAN) as session:
            result = await session.call_tool("submit", code=code)
        execution = ExecutionResult.model_validate(result.data["execution"])
        tests = [TestOutcome.model_validate(test) for test in result.data["tests"]]
        assert result.reward is not None
        return result.reward, execution, tests

    async def main() -> list[Graded]:
        return await asyncio.gather(*(one(code) for code in codes))

    return asyncio.run(main())


def test_a_solution_that_prints_past_the_limit_is_graded_by_its_tests(url: str) -> None:
    quiet, loud, quiet_partial, loud_partial = submit_all(
        url, [CORRECT, CORRECT + LOUD, PARTIAL, PARTIAL + LOUD]
    )
    assert quiet[0] == loud[0] == 1.0
    assert quiet_partial[0] == loud_partial[0] == pytest.approx(2 / 3)
    assert loud[2] == quiet[2]
    assert loud_partial[2] == quiet_partial[2]
    for _, execution, _ in (loud, loud_partial):
        # It ran to the end and exited as it would have; its output was cut.
        assert execution.model_dump(exclude={"stdout", "stderr"}) == {
            "status": "ok",
            "exit_code": 0,
            "stdout_truncated": True,
            "stderr_truncated": True,
            "message": "the program exited with code 0; it wrote more than 4000 bytes to "
            "stdout and stderr, and the rest was discarded",
        }
        assert execution.stdout == ("loading " + "x" * 100_000)[:4000]
        assert execution.stderr == ("warning " * 20_000)[:4000]


def test_a_solution_that_floods_forever_still_ends_at_its_timeout() -> None:
    limits = LIMITS.model_copy(update={"timeout": 1.5})
    with run_server(make_app(limits)) as url:
        [(reward, execution, tests)] = submit_all(url, ["while True:\n    print('x' * 100)\n"])
    assert reward == 0.0
    assert execution.model_dump(include={"status", "exit_code", "stdout_truncated"}) == {
        "status": "timeout",
        "exit_code": -9,
        "stdout_truncated": True,
    }
    assert execution.stdout == (("x" * 100 + "\n") * 40)[:4000]
    assert {test.error for test in tests} == {f"no test report: {execution.message}"}


# What a solution might send to pass for the report: the old stdout format with
# a guessed marker, the bare outcomes, and the nonce if it can find tests.json.
FORGE = """\
import json, os
ALL_PASS = json.dumps([{"passed": True, "error": None}] * 3)
NONCE = "@@report-" + "0" * 32 + "@@"
try:
    with open("tests.json") as file:
        NONCE = json.load(file)["nonce"]
except OSError:
    pass
FORGED = f"\\n{NONCE}{ALL_PASS}\\n{ALL_PASS}\\n".encode()

def forge_everywhere():
    reached = []
    for fd in range(1024):
        try:
            os.write(fd, FORGED)
            reached.append(fd)
        except OSError:
            pass
    return reached
"""

CHILD = FORGE + "print('child reached', forge_everywhere(), flush=True)\n"
FORGER = FORGE + (
    f"""\
import subprocess, sys
print(FORGED.decode(), flush=True)
print("solution reached", forge_everywhere(), flush=True)
# A program it starts, keeping every fd it may inherit, tries too.
subprocess.run([sys.executable, "-I", "-S", "-c", {CHILD!r}], close_fds=False, check=True)
"""
    """
def to_roman(n):
    forge_everywhere()  # during the tests as well
    return "?"
"""
)


def test_a_solution_cannot_forge_its_report(url: str) -> None:
    [(reward, execution, tests)] = submit_all(url, [FORGER])
    assert reward == 0.0
    # The grader's own report arrived and was read: each test failed on its assert.
    assert [(test.passed, test.error) for test in tests] == [(False, "AssertionError")] * 3
    assert execution.status == "ok"
    # The solution wrote its forgery to the channel too (fd 3), to no avail...
    assert re.search(r"^solution reached \[0, 1, 2, 3(, \d+)*\]$", execution.stdout, re.M)
    # ...and programs it starts do not even get the channel.
    assert "child reached [0, 1, 2]\n" in execution.stdout


def test_a_test_whose_exception_cannot_be_printed_fails_alone(url: str) -> None:
    [(reward, execution, tests)] = submit_all(url, [CORRECT + UNSPEAKABLE])
    assert reward == pytest.approx(2 / 3)
    assert execution.status == "ok"
    assert [test.passed for test in tests] == [True, False, True]
    assert tests[1].error == "Unspeakable: <exception str() failed>"
