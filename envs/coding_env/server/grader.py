"""The test runner that grades a submission, inside the sandbox (stdlib only).

It reads ``tests.json`` (the tests, a per-test time limit and a report
marker), deletes it, loads ``solution.py``, runs each test in a fresh copy of
the solution's namespace with a CPU-time alarm as its deadline, and prints one line
``MARKER`` + a JSON list of ``{"passed": bool, "error": str or null}``. It
exits 1 when the solution does not load (with the error printed as Python
would), else 0.

The solution runs in this same process, so a determined one can tamper with
the grading; see the README's "What the sandbox does NOT protect against".
"""

import json
import os
import signal
import sys
import traceback


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
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _print_error(exc: BaseException) -> None:
    """Print it as ``python solution.py`` would have, without this file's frames."""
    if isinstance(exc, SyntaxError):
        sys.stderr.write("".join(traceback.format_exception_only(exc)))
    else:
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))


def main() -> None:
    with open("tests.json", encoding="utf-8") as file:
        config = json.load(file)
    os.remove("tests.json")  # the solution need not see the tests or the marker
    outcomes, exit_code = grade(config["tests"], config["per_test_seconds"])
    sys.stdout.flush()
    sys.stdout.write("\n" + config["marker"] + json.dumps(outcomes) + "\n")
    sys.stdout.flush()
    os._exit(exit_code)  # whatever threads or exit hooks the solution left behind


if __name__ == "__main__":
    main()
