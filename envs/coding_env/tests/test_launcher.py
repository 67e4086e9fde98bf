"""The supervisor as a server that is not root starts it: as its own user, no uid of its own.

Here the tests are root, so the launcher is started directly under a spare
uid (as an unprivileged server would run), with ``uid: None`` in its config:
the process limit then counts that user's existing processes, and the kill
goes by process group and by children instead of by uid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coding_env.server.identities import Lease, processes_of
from coding_env.server.sandbox import default_python, shared_uid_pool

LAUNCHER = (Path(__file__).parents[1] / "server" / "launcher.py").read_text()
PYTHON = default_python(drop_privileges=True)

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
    print("fork refused after", children, "children")
"""

ESCAPE_AND_HANG = """\
import os, time
if os.fork() == 0:
    os.setsid()  # leaves the process group
    if os.fork() == 0:
        time.sleep(600)
    time.sleep(600)
print("started", flush=True)
time.sleep(600)
"""


@pytest.fixture
def lease() -> Iterator[Lease]:
    pool = shared_uid_pool()
    lease = pool.acquire()
    try:
        yield lease
    finally:
        pool.release(lease)


@pytest.fixture
def workdir(lease: Lease) -> Iterator[str]:
    # Not tmp_path: the run's uid must be able to reach it.
    path = tempfile.mkdtemp(prefix="coding-env-test-")
    os.chown(path, lease.uid, lease.gid)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def start(
    lease: Lease, workdir: str, code: str, max_processes: int = 8
) -> tuple[subprocess.Popen[str], int]:
    Path(workdir, "solution.py").write_text(code)
    report_r, report_w = os.pipe()
    config = {
        "status_fd": report_w,
        "uid": None,  # as a server that is not root: the user is shared
        "gid": None,
        "argv": [PYTHON, "-I", "-S", "solution.py"],
        "limits": {
            "cpu_seconds": 30,
            "memory_bytes": 256 * 2**20,
            "max_processes": max_processes,
            "max_file_bytes": 2**20,
            "max_open_files": 64,
            "nice": 19,
        },
    }
    process = subprocess.Popen(
        [PYTHON, "-I", "-S", "-c", LAUNCHER, json.dumps(config)],
        cwd=workdir,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(report_w,),
        user=lease.uid,
        group=lease.gid,
        extra_groups=[],
    )
    os.close(report_w)
    return process, report_r


def report_of(fd: int) -> dict[str, object]:
    with os.fdopen(fd, "rb") as pipe:
        return json.loads(pipe.read())  # type: ignore[no-any-return]


def test_the_process_limit_counts_the_users_processes(lease: Lease, workdir: str) -> None:
    process, report = start(lease, workdir, FORK_UNTIL_REFUSED)
    stdout, _ = process.communicate(timeout=60)
    # The launcher is 1 of the user's processes: it allows 8 more, the
    # program and 7 children, so the 8th fork is refused.
    assert stdout == "fork refused after 7 children\n"
    assert report_of(report) == {"returncode": 0, "stopped": False, "error": None}
    assert processes_of(lease.uid) == []  # the sleeping children were killed and reaped


def test_stopping_kills_processes_that_left_the_group(lease: Lease, workdir: str) -> None:
    process, report = start(lease, workdir, ESCAPE_AND_HANG)
    assert process.stdout is not None
    assert process.stdout.readline() == "started\n"
    deadline = time.monotonic() + 30
    while len(processes_of(lease.uid)) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # the escaped grandchild may still be starting
    assert len(processes_of(lease.uid)) == 4  # launcher, program, child, grandchild
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    process.stdout.close()
    assert report_of(report) == {"returncode": -9, "stopped": True, "error": None}
    assert processes_of(lease.uid) == []
