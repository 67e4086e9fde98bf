"""The coding environment against a real server on a free loopback port.

The server runs as root here, so every run gets its own uid and the process
limit is the kernel's; the tests check that nothing of any run survives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from coding_env import (
    CodeAction,
    CodeObservation,
    CodingEnv,
    CodingState,
    CodingTask,
    ExecutionResult,
)
from coding_env.server.app import app
from coding_env.server.environment import CodingEnvironment, load_split
from coding_env.server.sandbox import SandboxLimits, shared_uid_pool
from openenv import (
    ConcurrencyConfig,
    DeadlineError,
    EnvExecutionError,
    EnvValidationError,
    RemoteEnv,
    create_app,
)
from openenv.testing import run_server

# A correct solution for every shipped task: the tasks must be solvable.
SOLUTIONS = {
    "add": "def add(a, b):\n    return a + b\n",
    "reverse_string": "def reverse_string(s):\n    return s[::-1]\n",
    "is_palindrome": (
        "def is_palindrome(s):\n"
        "    t = [c.lower() for c in s if c.isalnum()]\n"
        "    return t == t[::-1]\n"
    ),
    "fizzbuzz": (
        "def fizzbuzz(n):\n"
        "    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz'\n"
        "            if i % 5 == 0 else str(i) for i in range(1, n + 1)]\n"
    ),
    "factorial": "import math\n\ndef factorial(n):\n    return math.factorial(n)\n",
    "fibonacci": (
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
        "    return a\n"
    ),
    "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
    "flatten": (
        "def flatten(items):\n"
        "    out = []\n"
        "    for item in items:\n"
        "        out.extend(flatten(item) if isinstance(item, list) else [item])\n"
        "    return out\n"
    ),
    "max_subarray": (
        "def max_subarray(nums):\n    best = cur = nums[0]\n    for x in nums[1:]:\n"
        "        cur = max(x, cur + x)\n        best = max(best, cur)\n    return best\n"
    ),
    "word_count": (
        "import collections, re\n\ndef word_count(text):\n"
        "    return dict(collections.Counter(re.findall('[a-z]+', text.lower())))\n"
    ),
    "primes_below": (
        "def primes_below(n):\n    if n < 3:\n        return []\n    sieve = [True] * n\n"
        "    sieve[0] = sieve[1] = False\n    for i in range(2, int(n ** 0.5) + 1):\n"
        "        if sieve[i]:\n            sieve[i * i::i] = [False] * len(range(i * i, n, i))\n"
        "    return [i for i in range(n) if sieve[i]]\n"
    ),
    "balanced": (
        "def balanced(s):\n    pairs = {')': '(', ']': '[', '}': '{'}\n    stack = []\n"
        "    for c in s:\n        if c in '([{':\n            stack.append(c)\n"
        "        elif c in pairs:\n            if not stack or stack.pop() != pairs[c]:\n"
        "                return False\n    return not stack\n"
    ),
    "gcd": "import math\n\ndef gcd(a, b):\n    return math.gcd(a, b)\n",
    "roman": (
        "def to_roman(n):\n"
        "    table = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
        "             (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n"
        "    out = ''\n    for value, letters in table:\n        while n >= value:\n"
        "            out += letters\n            n -= value\n    return out\n"
    ),
    "anagrams": (
        "def are_anagrams(a, b):\n"
        "    key = lambda s: sorted(s.replace(' ', '').lower())\n    return key(a) == key(b)\n"
    ),
    "binary_search": (
        "import bisect\n\ndef binary_search(items, target):\n"
        "    i = bisect.bisect_left(items, target)\n"
        "    return i if i < len(items) and items[i] == target else -1\n"
    ),
    "run_length": (
        "import itertools\n\ndef run_length(s):\n"
        "    return ''.join(f'{k}{len(list(g))}' for k, g in itertools.groupby(s))\n"
    ),
    "transpose": "def transpose(matrix):\n    return [list(row) for row in zip(*matrix)]\n",
}

# Tight limits, so that each failure mode is quick and exact. The wall clock is
# generous except where it is the subject: programs run at nice 19, and on a
# machine loaded by others they may wait for the CPU.
TIGHT = SandboxLimits(
    timeout=60,
    cpu_seconds=30,
    memory_bytes=64 * 2**20,
    max_processes=8,
    max_output_bytes=1000,
    max_file_bytes=2**20,
)
SHORT = TIGHT.model_copy(update={"timeout": 1.5})
ROOMY = SandboxLimits(timeout=120)


def make_app(limits: SandboxLimits, **settings: object) -> FastAPI:
    env = functools.partial(CodingEnvironment, limits=limits)
    return create_app(
        env, CodeAction, CodeObservation, ConcurrencyConfig(max_concurrent_envs=64), **settings
    )


FORK_UNTIL_REFUSED = """\
import os, time
children = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        children += 1
except BlockingIOError as exc:
    print("fork refused after", children, "children:", exc.strerror)
"""

FORK_BOMB = """\
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def solution_for(task: CodingTask) -> str:
    return SOLUTIONS[task.id.split("-", 1)[1]]


def sandbox_processes() -> list[int]:
    """Processes of any sandbox uid, zombies included."""
    pool = shared_uid_pool()
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/status", "rb") as status:
                uid = next(int(line.split()[1]) for line in status if line.startswith(b"Uid:"))
        except (OSError, ValueError, StopIteration):
            continue
        if pool.first <= uid < pool.first + pool.count:
            found.append(int(name))
    return found


def wait_until_no_sandbox_processes(patience: float = 10.0) -> None:
    deadline = time.monotonic() + patience
    while (left := sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], f"sandbox processes outlived their run: {left}"


def run_dirs() -> set[str]:
    tmp = os.environ.get("TMPDIR", "/tmp")
    return {name for name in os.listdir(tmp) if name.startswith("coding-env-")}


@pytest.fixture(scope="module")
def roomy_url() -> Iterator[str]:
    with run_server(make_app(ROOMY)) as url:
        yield url


def test_every_shipped_task_is_solved_by_its_reference_solution(roomy_url: str) -> None:
    async def main(url: str) -> dict[str, float]:
        env = RemoteEnv(url, task_cls=CodingTask)
        assert await env.list_splits() == ["train", "test"]
        tasks = [*await env.list_tasks("train"), *await env.list_tasks("test")]
        assert len(tasks) == 18

        async def solve(task: CodingTask) -> float:
            async with env.session(task) as session:
                return (await session.call_tool("submit", code=solution_for(task))).reward or 0

        rewards = await asyncio.gather(*(solve(t) for t in tasks))  # type: ignore[arg-type]
        return {task.id: reward for task, reward in zip(tasks, rewards, strict=True)}

    # The served app's task listing, the roomy app's runs: the same tasks.
    with run_server(app) as url:
        assert httpx.get(f"{url}/tasks", params={"split": "test"}).json()["tasks"] == [
            task.model_dump() for task in load_split("test")
        ]
    rewards = asyncio.run(main(roomy_url))
    assert rewards == dict.fromkeys(rewards, 1.0)


def test_a_full_episode_through_the_client(roomy_url: str) -> None:
    task = load_split("test")[1]  # to_roman, 3 tests
    with CodingEnv(roomy_url).sync() as env:
        first = env.reset(task=task).observation
        assert first.prompt.startswith("Write a function `to_roman(n)`")
        assert first.execution is None

        ran = env.step(CodeAction(code="print('trying', 2 + 2)")).observation
        assert ran.execution == ExecutionResult(
            status="ok", exit_code=0, stdout="trying 4\n", message="the program exited with code 0"
        )
        assert (ran.reward, ran.done) == (None, False)

        # Right for 4 and 3999's shape but not 1994's: 2 of 3 tests pass.
        partial = "def to_roman(n):\n    return {4: 'IV', 3999: 'MMMCMXCIX'}.get(n, '?')\n"
        result = env.step(CodeAction(code=partial, submit=True))
        assert result.reward == pytest.approx(2 / 3)
        assert result.done is True
        obs = result.observation
        assert (obs.tests_passed, obs.tests_total) == (2, 3)
        assert [t.passed for t in obs.tests] == [True, False, True]
        assert obs.tests[1].error == "AssertionError"
        assert obs.execution is not None
        assert obs.execution.status == "ok"

        state = env.state()
        assert isinstance(state, CodingState)
        assert (state.task_id, state.runs, state.step_count, state.done) == (
            "test-roman",
            1,
            2,
            True,
        )
        with pytest.raises(EnvExecutionError, match="the episode is over"):
            env.step(CodeAction(code="print(1)"))
        # The session goes on: a new episode.
        assert env.reset(seed=0).observation.prompt.startswith("Write a function `add(a, b)`")


def test_a_submission_that_does_not_compile_scores_zero(roomy_url: str) -> None:
    with CodingEnv(roomy_url).sync() as env:
        env.reset(seed=0)
        result = env.call_tool("submit", code="def add(a, b)\n    return a + b\n")
    assert (result.reward, result.finished) == (0.0, True)
    execution = ExecutionResult.model_validate(result.data["execution"])
    assert execution.status == "syntax_error"
    assert execution.stderr.splitlines()[-1] == "SyntaxError: expected ':'"
    assert result.text.splitlines()[0] == "0/3 tests passed"
    assert result.text.splitlines()[1] == (
        "FAILED assert add(2, 3) == 5: the solution failed to load: "
        "SyntaxError: expected ':' (solution.py, line 1)"
    )


def test_50_concurrent_sessions_run_and_submit(roomy_url: str) -> None:
    async def main(url: str) -> list[tuple[str, float]]:
        env = RemoteEnv(url, task_cls=CodingTask)
        tasks = await env.list_tasks("train")

        async def episode(i: int) -> tuple[str, float]:
            task = tasks[i % len(tasks)]
            async with env.session(task) as session:
                ran = await session.call_tool("run_code", code=f"print({i} * 2)")
                submitted = await session.call_tool("submit", code=solution_for(task))  # type: ignore[arg-type]
                return ran.data["stdout"], submitted.reward or 0.0

        return await asyncio.gather(*(episode(i) for i in range(50)))

    before = run_dirs()
    results = asyncio.run(main(roomy_url))
    assert httpx.get(f"{roomy_url}/health").json()["active_sessions"] == 0
    assert results == [(f"{i * 2}\n", 1.0) for i in range(50)]
    wait_until_no_sandbox_processes()
    assert run_dirs() <= before  # every working directory was removed


# Each: the program, the limits it runs under, and the result it must end with.
CASES: dict[str, tuple[str, dict[str, object]]] = {
    "infinite loop": (
        "while True:\n    pass\n",
        {
            "status": "timeout",
            "exit_code": -9,
            "message": "the program ran past 1.5 s and was killed",
        },
    ),
    "memory hog": (
        "hog = []\nwhile True:\n    hog.append(bytearray(2**20))\n",
        {"status": "memory_limit", "exit_code": 1},
    ),
    "process limit": (
        FORK_UNTIL_REFUSED,
        {
            "status": "ok",
            "exit_code": 0,
            # 8 processes: the program and 7 children; the 8th fork is refused.
            "stdout": "fork refused after 7 children: Resource temporarily unavailable\n",
        },
    ),
    "fork bomb": (FORK_BOMB, {"status": "timeout", "exit_code": -9}),
    "stdout flood": (
        "while True:\n    print('x' * 100)\n",
        {
            "status": "output_limit",
            "exit_code": -9,
            "stdout": ("x" * 100 + "\n") * 9 + "x" * 91,
            "stdout_truncated": True,
            "message": (
                "the program wrote more than 1000 bytes to stdout; "
                "the rest was discarded and the program killed"
            ),
        },
    ),
    "stderr flood": (
        "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)\n",
        {"status": "output_limit", "exit_code": -9, "stderr": "e" * 1000},
    ),
    "non-zero exit": (
        "import sys\nprint('bye')\nsys.exit(3)\n",
        {"status": "error", "exit_code": 3, "stdout": "bye\n"},
    ),
    "exception": (
        "1 / 0\n",
        {"status": "error", "exit_code": 1},
    ),
    "syntax error": (
        "def f(:\n    pass\n",
        {
            "status": "syntax_error",
            "exit_code": 1,
            "stderr": '  File "solution.py", line 1\n    def f(:\n          ^\n'
            "SyntaxError: invalid syntax\n",
            "message": "the program does not compile: SyntaxError: invalid syntax",
        },
    ),
    "killed by a signal": (
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
        {"status": "error", "exit_code": -11, "message": "the program was killed by SIGSEGV"},
    ),
    "file size limit": (
        "open('big', 'wb').write(b'0' * 2 * 2**20)\n",
        {"status": "error", "exit_code": 1},
    ),
    "no secrets in the environment": (
        "import os\nprint(sorted(os.environ))\n",
        {"status": "ok", "stdout": "['HOME', 'LANG', 'PATH', 'TMPDIR']\n"},
    ),
    "a background process is killed with the program": (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\n"
        "print('left')\n",
        {"status": "ok", "exit_code": 0, "stdout": "left\n"},
    ),
}


# Only these are about the wall clock; they run with SHORT limits.
WALL_CLOCK_CASES = {"infinite loop", "fork bomb"}


def test_failure_modes_end_with_exact_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENENV_TEST_SECRET", "hunter2")  # the server's environment

    async def run(url: str, code: str) -> ExecutionResult:
        async with CodingEnv(url) as env:
            await env.reset(seed=0)
            execution = (await env.step(CodeAction(code=code))).observation.execution
            assert execution is not None
            return execution

    async def main(short_url: str, tight_url: str) -> list[ExecutionResult]:
        return await asyncio.gather(
            *(
                run(short_url if name in WALL_CLOCK_CASES else tight_url, code)
                for name, (code, _) in CASES.items()
            )
        )

    with run_server(make_app(SHORT)) as short_url, run_server(make_app(TIGHT)) as tight_url:
        results = dict(zip(CASES, asyncio.run(main(short_url, tight_url)), strict=True))
        wait_until_no_sandbox_processes()
        # The servers are fine: no session left open, and the next one runs code as usual.
        for url in (short_url, tight_url):
            assert httpx.get(f"{url}/health").json()["active_sessions"] == 0
        with CodingEnv(tight_url).sync() as env:
            env.reset(seed=0)
            still_here = env.step(CodeAction(code="print('still here')")).observation.execution
    assert still_here == ExecutionResult(
        status="ok", exit_code=0, stdout="still here\n", message="the program exited with code 0"
    )
    for name, (_, expected) in CASES.items():
        got = results[name].model_dump(include=set(expected))
        assert got == expected, name
    assert results["memory hog"].stderr.endswith("\nMemoryError\n")
    assert results["memory hog"].message == "the program ran out of memory (limit 64 MiB)"
    assert results["exception"].stderr.endswith("ZeroDivisionError: division by zero\n")
    assert results["file size limit"].stderr.endswith("OSError: [Errno 27] File too large\n")
    assert results["stderr flood"].stdout_truncated is False


ESCAPE = """\
import os, signal, time
child = os.fork()
if child == 0:
    os.setsid()  # out of the run's process group, adopted by PID 1 once the launcher dies
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
os.kill(os.getppid(), signal.SIGKILL)  # the launcher runs under this uid too
time.sleep(120)
"""


def test_a_program_that_kills_its_launcher_leaves_nothing_running(roomy_url: str) -> None:
    with CodingEnv(roomy_url).sync() as env:
        env.reset(seed=0)
        execution = env.step(CodeAction(code=ESCAPE)).observation.execution
        assert execution is not None
        escaped = int(execution.stdout.split()[0])
        # By the time the step answered, the run's uid was swept: the orphan is gone.
        assert not alive(escaped)
        wait_until_no_sandbox_processes()
        still = env.step(CodeAction(code="print('next')")).observation.execution
        assert still is not None
        assert still.stdout == "next\n"


DEEP_FOLDERS = """\
import os, signal, time
child = os.fork()
if child == 0:
    os.setsid()
    time.sleep(120)
    os._exit(0)
for _ in range(3000):  # deeper than shutil.rmtree's recursion goes
    os.mkdir("d")
    os.chdir("d")
print(child, flush=True)
os.kill(os.getppid(), signal.SIGKILL)  # only the sweep of the uid can end the child now
"""


def test_a_program_that_nests_folders_deeply_is_cleaned_up_after(roomy_url: str) -> None:
    before = run_dirs()
    with CodingEnv(roomy_url).sync() as env:
        env.reset(seed=0)
        execution = env.step(CodeAction(code=DEEP_FOLDERS)).observation.execution
        assert execution is not None
        # Its result, not an EXECUTION_ERROR: removing its folder is the server's business.
        assert execution.status == "error"
        # The uid was still swept and given back, and the folder removed.
        assert not alive(int(execution.stdout))
        still = env.step(CodeAction(code="print('next')")).observation.execution
        assert still is not None
        assert still.stdout == "next\n"
    assert run_dirs() <= before


KEEPS_WRITING = """\
import os, signal
folder = os.getcwd()
writers = []
for _ in range(4):
    child = os.fork()
    if child == 0:
        os.setsid()
        os.close(1)
        os.close(2)
        i = 0
        while True:  # new files in its folder, remade if need be, for as long as it lives
            i += 1
            try:
                os.makedirs(folder, exist_ok=True)
                open(os.path.join(folder, f"{os.getpid()}-{i}"), "w").close()
            except OSError:
                pass
    writers.append(child)
while not all(os.path.exists(f"{writer}-1") for writer in writers):
    pass  # every writer is at work
print(folder, *writers, flush=True)
os.kill(os.getppid(), signal.SIGKILL)
"""


def test_a_program_that_keeps_writing_after_its_launcher_died_leaves_no_folder(
    roomy_url: str,
) -> None:
    with CodingEnv(roomy_url).sync() as env:
        env.reset(seed=0)
        execution = env.step(CodeAction(code=KEEPS_WRITING)).observation.execution
        assert execution is not None
        folder, *writers = execution.stdout.split()
        assert not any(alive(int(writer)) for writer in writers)
        # They were killed before their folder was removed, not raced by the removal.
        assert not os.path.lexists(folder)


STOPS_ITS_LAUNCHER = """\
import os, signal, time
print(os.getpid(), flush=True)
os.kill(os.getppid(), signal.SIGSTOP)  # the launcher runs under this uid too
time.sleep(600)
"""


def test_a_program_that_stops_its_launcher_and_runs_on_is_a_timeout() -> None:
    with run_server(make_app(SHORT)) as url, CodingEnv(url).sync() as env:
        env.reset(seed=0)
        execution = env.step(CodeAction(code=STOPS_ITS_LAUNCHER)).observation.execution
    assert execution is not None
    assert execution.model_dump(include={"status", "exit_code", "message"}) == {
        "status": "timeout",
        "exit_code": -9,
        "message": "the program ran past 1.5 s and was killed",
    }
    assert not alive(int(execution.stdout))


def alive(pid: int) -> bool:
    """Running (a zombie left to a PID 1 that does not reap is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_cpu_limit() -> None:
    with run_server(make_app(SandboxLimits(timeout=120, cpu_seconds=1))) as url:
        client = CodingEnv(url, message_timeout=180).sync()
        with client:
            client.reset(seed=0)
            obs = client.step(CodeAction(code="while True:\n    pass\n")).observation
    assert obs.execution is not None
    assert obs.execution.model_dump(include={"status", "exit_code", "message"}) == {
        "status": "cpu_limit",
        "exit_code": -24,  # SIGXCPU
        "message": "the program used more than 1 s of CPU and was killed",
    }


def test_a_step_cancelled_by_the_server_deadline_leaves_nothing_behind() -> None:
    # The step after the cancelled one must also finish within the 1 s deadline:
    # at nice 19 on a machine busy with others, even a print may take longer.
    server_app = make_app(ROOMY.model_copy(update={"nice": 0}), step_timeout=1)
    before = run_dirs()
    with run_server(server_app) as url, CodingEnv(url).sync() as client:
        client.reset(seed=0)
        with pytest.raises(DeadlineError, match="did not return within 1s and was cancelled"):
            client.step(CodeAction(code="import os\nos.fork()\nwhile True:\n    pass\n"))
        wait_until_no_sandbox_processes()
        # The async step was cancelled, so the session goes on.
        obs = client.step(CodeAction(code="print('next')")).observation
        assert obs.execution is not None
        assert obs.execution.stdout == "next\n"
    assert run_dirs() <= before


def test_bad_actions_get_validation_errors_and_the_session_goes_on(roomy_url: str) -> None:
    with CodingEnv(roomy_url).sync() as env:
        env.reset(seed=0)
        with pytest.raises(EnvValidationError):
            env.step({"code": 42})
        with pytest.raises(EnvValidationError):
            env.step(CodeAction.model_construct(code="x" * 100_001))
        with pytest.raises(EnvValidationError):
            env.call_tool("run_code", source="print(1)")
        assert env.call_tool("run_code", code="print(1)").data["stdout"] == "1\n"


def test_the_readme_example_runs_as_written(roomy_url: str) -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", readme.split("## Drive", 1)[1], re.DOTALL)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace("http://localhost:8000", roomy_url), "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Write a function `add(a, b)`")
    assert lines[-3:] == ["ok 5", "3/3 tests passed 1.0", "the program exited with code 3"]
