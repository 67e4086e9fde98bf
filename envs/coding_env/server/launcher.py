"""The supervisor that runs inside the sandbox, between the server and the program.

The server starts it as ``python -I -S -c <this file's source> <config>``, in
the run's working directory. When the server is root, it first
becomes the run's unprivileged uid (doing it here rather than in the server's
fork works with any event loop, uvloop included). It sets the resource limits, starts the program as
its only child, reaps every process that ends up beneath it (it is a child
subreaper, so orphans come to it instead of to PID 1, which may never reap
them), and once the program has exited, or the server sends SIGTERM, kills
and reaps everything the program left behind. It writes one JSON line to the status
pipe, ``{"returncode": ..., "stopped": ..., "error": ...}``, and exits.

With ``channel_fd`` in its config, the program gets that pipe as its fd 3
(``CHANNEL_FD``), a channel of its own to the server besides stdout and
stderr: the grader sends its report there, where the program's prints never go.

Only the standard library may be used here: the sandbox's interpreter runs
without site-packages.

>>> _ppid(b"42 (a (weird) name) S 7 42 42 0")
7
"""

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
# Both stay blocked and are taken with sigtimedwait, so a SIGTERM can never
# land between two statements and leave the program running unsupervised.
_WATCHED = {signal.SIGTERM, signal.SIGCHLD}
# Where the program finds the channel, if it has one.
CHANNEL_FD = 3


def main() -> None:
    config = json.loads(sys.argv[1])
    status_fd = config["status_fd"]
    os.set_inheritable(status_fd, False)  # the program must not write our report
    channel_fd = config.get("channel_fd")
    if channel_fd is not None:
        os.set_inheritable(channel_fd, False)  # the program gets it as CHANNEL_FD only
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
    report: dict[str, object] = {"returncode": None, "stopped": False, "error": None}
    program = None
    # A process group of our own (to be killed as one if we ever hang), in the
    # server's session: a new session would be a new scheduling group
    # ("autogroup"), weighing as much as the whole server however nice we are.
    with contextlib.suppress(PermissionError):  # already a session (so group) leader
        os.setpgid(0, 0)
    os.setpriority(os.PRIO_PROCESS, 0, config["limits"]["nice"])
    try:
        if config["uid"] is not None:
            _become(config["uid"], config["gid"])
        _become_subreaper()
        _set_limits(config)
        program = _spawn(config["argv"], channel_fd)
        if channel_fd is not None:
            # The program's copy is the only writer left: the server sees the
            # channel end when the program and whatever inherited it are gone.
            os.close(channel_fd)
        report["returncode"], report["stopped"] = _supervise(program)
    except OSError as exc:  # the uid, the limits or the fork were refused
        report["error"] = f"{type(exc).__name__}: {exc}"
    status = _kill_everything(program, config["uid"] is not None)
    if report["returncode"] is None:
        report["returncode"] = status
    os.write(status_fd, json.dumps(report).encode() + b"\n")


def _become(uid: int, gid: int) -> None:
    """Drop root for the run's own uid, before anything of the program exists."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _set_limits(config: dict[str, object]) -> None:
    limits = config["limits"]
    assert isinstance(limits, dict)
    cpu = int(limits["cpu_seconds"])
    if config["uid"] is not None:
        # The uid is this run's alone: count this launcher, then the program's share.
        nproc = int(limits["max_processes"]) + 1
    else:
        # The uid is shared with the server and other runs; the kernel counts all of
        # their processes, so allow this many more than there are now.
        nproc = _tasks_of(os.getuid()) + int(limits["max_processes"])
    for what, soft, hard in (
        (resource.RLIMIT_CORE, 0, 0),
        # SIGXCPU at the soft limit; SIGKILL a second later if it is caught.
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, limits["memory_bytes"], limits["memory_bytes"]),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_FSIZE, limits["max_file_bytes"], limits["max_file_bytes"]),
        (resource.RLIMIT_NOFILE, limits["max_open_files"], limits["max_open_files"]),
    ):
        resource.setrlimit(what, (int(soft), int(hard)))


def _spawn(argv: list[str], channel_fd: int | None) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.setpgid(0, 0)  # its own process group, which can be killed at once
            if channel_fd is not None:
                os.dup2(channel_fd, CHANNEL_FD)
                # dup2 onto itself keeps close-on-exec: clear it either way.
                os.set_inheritable(CHANNEL_FD, True)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    return pid


def _supervise(program: int) -> tuple[int | None, bool]:
    """Wait for the program to exit (its exit code) or for SIGTERM (stopped)."""
    while True:
        status = _reap(program)
        if status is not None:
            return status, False
        info = signal.sigtimedwait(_WATCHED, 1.0)
        if info is not None and info.si_signo == signal.SIGTERM:
            # Too late if the program has ended meanwhile: then it was not stopped.
            status = _reap(program)
            return status, status is None


def _reap(program: int | None) -> int | None:
    """Reap every child that has exited; the program's exit code if it was one of them."""
    status = None
    try:
        while True:
            pid, code = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return status
            if pid == program:
                status = os.waitstatus_to_exitcode(code)
    except ChildProcessError:
        return status


def _kill_everything(program: int | None, own_uid: bool) -> int | None:
    """Kill and reap every process beneath this one; the program's exit code if reaped here."""
    status = None
    if own_uid:
        # Every other process of this uid, in one sweep that no fork can outrun.
        _kill(-1)
    for _ in range(2000):
        if program is not None:
            _kill(-program)  # its process group
        for child in _children():
            _kill(child)
        reaped = _reap(program)
        status = reaped if status is None else status
        if not _children():
            return status
        # Children are still dying; their own orphans may come to us next.
        time.sleep(0.005)
    return status


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _children() -> list[int]:
    """This process's children, from /proc (it may lack the ``children`` file)."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                if _ppid(stat.read()) == me:
                    found.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _ppid(stat: bytes) -> int:
    # The command name may hold spaces and parentheses; the fields after the last ")" do not.
    return int(stat.rsplit(b")", 1)[1].split()[1])


def _tasks_of(uid: int) -> int:
    """How many tasks (processes and threads) the kernel counts for ``uid``."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as status:
                fields = dict(line.split(b":", 1) for line in status if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                total += int(fields[b"Threads"])
        except (OSError, ValueError, KeyError):
            continue
    return total


if __name__ == "__main__":
    main()
