"""The test runner that grades a submission, inside the sandbox (stdlib only).

It reads ``tests.json`` (the tests, a per-test time limit and a nonce),
deletes it, loads ``solution.py``, runs each test in a fresh copy of the
solution's namespace with a CPU-time alarm as its deadline, and sends one
line, the nonce + a JSON list of ``{"passed": bool, "error": str or null}``,
on the run's channel (fd 3), not on stdout: the solution may print as much as
it likes, and its prints can neither bury nor pass for the report. It exits 1
when the solution does not load (with the error printed as Python would),
else 0.

The solution runs in this same process, so a determined one can tamper with
the grading; see the README's "What the sandbox does NOT protect against".
"""

import contextlib
import json
import os
import signal
import sys
import traceback

# The run's channel to the server (``launcher.CHANNEL_FD``).
CHANNEL_FD = 3
# Per test: a failing test's message is for people, and the report must stay small.
MAX_ERROR_CHARS = 1000


def _expired(signum: int, frame: object) -> None:
    raise TimeoutError("the test used up its CPU time")


def grade(tests: list[str], per_test: float) -> tuple[list[dict[str, object]], int]:
    """One outcome per test, and the exit code: 1 if the solution did not load."""
    namespace: dict[str, object] = {"__name__": "solution"}
    try:
        with open("solution.py", encoding="utf-8") as file:
            source = file.read()
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included
        _print_error(exc)
        error = f"the solution failed to load: {_describe(exc)}"
        return [{"passed": False, "error": error} for _ in tests], 1
    # CPU time, not wall-clock time: a loaded machine must not fail a test.
    signal.signal(signal.SIGPROF, _expired)
    outcomes: list[dict[str, object]] = []
    for test in tests:
        signal.setitimer(signal.ITIMER_PROF, per_test)
        try:
            exec(compile(test, "<test>", "exec"), dict(namespace))
            outcomes.append({"passed": True, "error": None})
        except BaseException as exc:
            outcomes.append({"passed": False, "error": _describe(exc)})
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    return outcomes, 0


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException:  # its __str__ is the solution's code: it may raise, or run out of time
        message = "<exception str() failed>"
    text = f"{name}: {message}" if message else name
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _print_error(exc: BaseException) -> None:
    """Print it as ``python solution.py`` would have, without this file's frames."""
    if isinstance(exc, SyntaxError):
        sys.stderr.write("".join(traceback.format_exception_only(exc)))
    else:
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))


def _send(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(CHANNEL_FD, view) :]


def main() -> None:
    # Before any of the solution runs: programs it starts do not get the channel.
    os.set_inheritable(CHANNEL_FD, False)
    with open("tests.json", encoding="utf-8") as file:
        config = json.load(file)
    os.remove("tests.json")  # the solution need not see the tests or the nonce
    outcomes, exit_code = grade(config["tests"], config["per_test_seconds"])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # the solution may have broken it
            stream.flush()
    # On a line of its own, whatever the solution wrote to the channel before.
    report = "\n" + config["nonce"] + json.dumps(outcomes) + "\n"
    with contextlib.suppress(OSError):  # the solution closed the channel: no report
        _send(report.encode())
    os._exit(exit_code)  # whatever threads or exit hooks the solution left behind


if __name__ == "__main__":
    main()
