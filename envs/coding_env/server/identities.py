"""Unprivileged uids for sandboxed runs: one per run, while the server is root.

The kernel's process limit (``RLIMIT_NPROC``) counts every process of a uid
and does not apply to root at all. Giving each run a uid of its own makes the
limit apply, and apply per run; it also lets the run's supervisor kill every
process of that uid at once, wherever in the process tree it hid.

A uid is claimed with an ``flock`` on a file in a root-only directory, so
several server processes on one machine never hand out the same uid, and a
claim dies with the process that held it. Only uids without a name in the
user database are used, so no real account's processes are ever touched.

>>> pool = UidPool(first=190_000, count=4)
>>> pool.first, pool.count
(190000, 4)
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import pwd
import signal
import stat
import tempfile
import threading
import time
from dataclasses import dataclass

from openenv import EnvError

__all__ = ["Lease", "SandboxBusyError", "UidPool", "processes_of"]

logger = logging.getLogger("coding_env.sandbox")


class SandboxBusyError(EnvError, RuntimeError):
    """Every uid of the pool is running a program (the client is told so)."""


@dataclass
class Lease:
    """One uid, held for one run."""

    uid: int
    gid: int
    lock_fd: int
    # Processes of the uid may be left (of a server that died, or of a supervisor
    # that had to be killed): kill them, and check, before the uid is used again.
    suspect: bool = False


class UidPool:
    """Hands out uids ``first .. first + count - 1``, one per concurrent run.

    Args:
        first: The first uid of the range; pick one no account uses.
        count: How many runs may execute at once in all server processes.
        lock_dir: Where the claims live (a directory only root can enter).
    """

    def __init__(self, first: int = 190_000, count: int = 1024, lock_dir: str | None = None):
        self.first = first
        self.count = count
        self.lock_dir = lock_dir or os.path.join(tempfile.gettempdir(), "openenv-sandbox-uids")
        self._lock = threading.Lock()
        self._in_use: set[int] = set()
        # Uids of the range that had processes when this pool first looked (a
        # server that died mid-run leaves some); None until it has looked.
        self._leftovers: set[int] | None = None
        self._quarantined: set[int] = set()
        self._dir_fd: int | None = None

    def acquire(self) -> Lease:
        """Claim a free uid, first killing anything a dead server left running under it.

        Blocking (it may scan /proc): call it from a worker thread.

        Raises:
            SandboxBusyError: every uid of the pool is in use.
        """
        with self._lock:
            if self._leftovers is None:  # one scan of /proc for the whole range
                self._leftovers = {uid for uid in _uids_with_processes() if self._owns(uid)}
        while True:
            lease = self._claim_next()
            if not lease.suspect or _clear(lease.uid):
                lease.suspect = False
                return lease
            self._quarantine(lease)

    def sweep(self, lease: Lease) -> None:
        """Kill every process of the lease's uid now; it stays suspect if some survive. Blocking."""
        lease.suspect = True
        lease.suspect = not _clear(lease.uid)

    def release(self, lease: Lease) -> None:
        """Give the uid back; a suspect one is checked (and killed) first. Blocking."""
        if lease.suspect and not _clear(lease.uid):
            self._quarantine(lease)
            return
        with self._lock:
            self._in_use.discard(lease.uid)
        os.close(lease.lock_fd)

    def _owns(self, uid: int) -> bool:
        return self.first <= uid < self.first + self.count

    def _claim_next(self) -> Lease:
        # The lowest free uid: the same few are reused, so a busy server touches
        # only as many uids as it runs programs at once.
        with self._lock:
            directory = self._directory()
            assert self._leftovers is not None
            for uid in range(self.first, self.first + self.count):
                if uid in self._in_use or uid in self._quarantined or _has_account(uid):
                    continue
                fd = _claim(directory, uid)
                if fd is None:
                    continue  # another server process holds it
                self._in_use.add(uid)
                suspect = uid in self._leftovers
                self._leftovers.discard(uid)
                return Lease(uid=uid, gid=uid, lock_fd=fd, suspect=suspect)
        raise SandboxBusyError(
            f"all {self.count} sandbox uids ({self.first}-{self.first + self.count - 1}) "
            f"are running programs; try again when a run has finished"
        )

    def _quarantine(self, lease: Lease) -> None:
        # Its processes could not be reaped (zombies under a PID 1 that never
        # reaps) and still count against the uid's process limit. Keep the
        # claim, so that no server process reuses the uid.
        logger.error("uid %d still has processes after its run; not reusing it", lease.uid)
        with self._lock:
            self._quarantined.add(lease.uid)
            self._in_use.discard(lease.uid)

    def _directory(self) -> int:
        if self._dir_fd is not None:
            return self._dir_fd
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.lock_dir, 0o700)
        fd = os.open(self.lock_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            os.close(fd)
            raise PermissionError(
                f"{self.lock_dir} must belong to uid {os.geteuid()} with mode 0700, so that "
                f"sandboxed programs cannot touch the uid claims"
            )
        self._dir_fd = fd
        return fd


def _claim(directory: int, uid: int) -> int | None:
    fd = os.open(f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=directory)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@functools.cache
def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _clear(uid: int, patience: float = 2.0) -> bool:
    """Kill every process of ``uid``; whether none is left (zombies included)."""
    deadline = time.monotonic() + patience
    while True:
        pids = processes_of(uid)
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)  # SIGKILLed processes take a moment to be reaped


def processes_of(uid: int) -> list[int]:
    """The processes (zombies included) whose real uid is ``uid``, from /proc."""
    return [pid for pid, owner in _process_owners() if owner == uid]


def _uids_with_processes() -> set[int]:
    return {owner for _, owner in _process_owners()}


def _process_owners() -> list[tuple[int, int]]:
    """(pid, real uid) of every process, zombies included."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as status:
                for line in status:
                    if line.startswith(b"Uid:"):
                        found.append((int(name), int(line.split()[1])))
                        break
        except (OSError, ValueError):
            continue
    return found
