"""The shared slot board: one server's session cap, across its worker processes.

``openenv serve --workers N`` (and ``openenv.serve(..., workers=N)``) runs N
processes on one listening socket; the kernel hands each connection to one of
them. For the cap to hold for the whole server, each worker counts its slots
on a ``SlotBoard``: a small table in shared memory (a file under
``/dev/shm``), one row per worker, changed only under an exclusive ``flock``.

Why file locks rather than a ``multiprocessing`` lock or a manager process:
the kernel releases a ``flock`` when its holder dies, however it dies. A
worker killed with SIGKILL, or by a segfault in environment code, cannot leave
the board locked, and the lock on its own row is what tells the others that
it is gone: whoever next finds the row unlocked zeroes it, which frees the
dead worker's slots, and its replacement claims the row again. No supervisor
has to be told anything, so this works under any process manager that passes
``OPENENV_SLOT_BOARD`` on to its workers.

A worker's row holds its open sessions and the connections it has waiting in
line. Taking a slot reads the whole table (a few rows: microseconds) under the
board lock, so a burst on every worker at once still never exceeds the cap.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import re
import shutil
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

__all__ = [
    "BOARD_VAR",
    "SlotBoard",
    "add_numbers",
    "forget_worker",
    "remove_if_unused",
]

BOARD_VAR: Final = "OPENENV_SLOT_BOARD"

_ROWS: Final = 1024  # workers per board, counting replacements that reuse a row
_ACTIVE, _QUEUED, _PID = 0, 1, 2  # the numbers in a row: two counts, whose row it is
_WIDTH: Final = 3
_GONE: Final = -1  # in place of a pid: its worker died, whoever still holds the row lock
_HIGH_WATER: Final = _ROWS * _WIDTH  # one int64 after the rows: rows ever claimed


class SlotBoard:
    """This worker's row on the shared board of one app.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> a, b = SlotBoard.join(folder, "echo"), SlotBoard.join(folder, "echo")
    >>> a.take(2), b.take(2), b.take(2)
    (True, True, False)
    >>> a.give(); b.take(2)
    True
    >>> a.totals(), a.workers()
    ((2, 0), 2)
    >>> a.leave(); b.leave()
    """

    def __init__(
        self, folder: Path, row: int, lock_fd: int, row_fd: int, memory: mmap.mmap
    ) -> None:
        self.folder = folder
        self.row = row
        self._lock_fd = lock_fd
        self._row_fd = row_fd  # held locked for this worker's whole life
        self._memory = memory
        self._view = memoryview(memory).cast("q")
        self._peers: dict[int, int] = {}  # row -> an fd of its lock file, to test it
        _JOINED.add(self)

    @classmethod
    def from_env(cls, app_name: str) -> SlotBoard | None:
        """Join the board named by ``OPENENV_SLOT_BOARD``, if the supervisor set one."""
        folder = os.environ.get(BOARD_VAR)
        return None if not folder else cls.join(folder, app_name)

    @classmethod
    def join(cls, folder: str | Path, app_name: str) -> SlotBoard:
        """Claim a free row of ``app_name``'s board in ``folder`` (created if need be)."""
        base = Path(folder) / re.sub(r"[^A-Za-z0-9_.+-]", "_", app_name or "app")
        base.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(base / "board", os.O_RDWR | os.O_CREAT, 0o600)
        size = (_HIGH_WATER + 1) * 8
        with _locked(lock_fd):
            if os.fstat(lock_fd).st_size < size:
                os.ftruncate(lock_fd, size)
            # Mapped through a file of its own: mmap keeps a duplicate of the
            # descriptor, which would otherwise share the board lock.
            map_fd = os.open(base / "board", os.O_RDWR)
            memory = mmap.mmap(map_fd, size)
            os.close(map_fd)
            view = memoryview(memory).cast("q")
            for row in range(_ROWS):
                row_fd = os.open(base / f"row-{row}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                if _try_lock(row_fd):
                    # Free: never used, or its worker died. Whatever it counted is gone.
                    view[row * _WIDTH + _ACTIVE] = view[row * _WIDTH + _QUEUED] = 0
                    view[row * _WIDTH + _PID] = os.getpid()
                    view[_HIGH_WATER] = max(view[_HIGH_WATER], row + 1)
                    _retire(base, row)
                    view.release()
                    return cls(base, row, lock_fd, row_fd, memory)
                os.close(row_fd)
            view.release()
        memory.close()
        os.close(lock_fd)
        raise RuntimeError(f"every one of the {_ROWS} worker rows of {base} is in use")

    def take(self, cap: int) -> bool:
        """Count one more session for this worker, if the whole server has room."""
        with _locked(self._lock_fd):
            active, _ = self._sum()
            if active >= cap:
                self._sweep()
                active, _ = self._sum()
            if active >= cap:
                return False
            self._view[self.row * _WIDTH + _ACTIVE] += 1
            return True

    def give(self) -> None:
        """Count one session fewer for this worker."""
        with _locked(self._lock_fd):
            self._view[self.row * _WIDTH + _ACTIVE] -= 1

    def set_queued(self, waiting: int) -> None:
        """Publish how many connections wait in this worker's line."""
        self._view[self.row * _WIDTH + _QUEUED] = waiting

    def queued_elsewhere(self) -> int:
        """Connections other workers hold in line (a fresh arrival queues behind them)."""
        _, queued = self._sum()
        return queued - self._view[self.row * _WIDTH + _QUEUED]

    def totals(self) -> tuple[int, int]:
        """Sessions open and connections waiting, across every live worker."""
        with _locked(self._lock_fd):
            self._sweep()
            return self._sum()

    def workers(self) -> int:
        """Worker processes alive on this board, this one included."""
        with _locked(self._lock_fd):
            return 1 + sum(1 for row in self._rows() if row != self.row and self._held(row))

    def publish(self, numbers: dict[str, Any]) -> None:
        """Share this worker's metric counters, for any worker's ``/metrics`` to add up."""
        path = self.folder / f"metrics-{self.row}.json"
        staged = path.with_suffix(".tmp")
        staged.write_text(json.dumps(numbers))
        os.replace(staged, path)  # readers see the old numbers or the new, never half

    def peer_numbers(self) -> list[dict[str, Any]]:
        """The counters other workers published, and those of workers gone.

        A dead worker's gauges (under ``"gauges"``) are left out: what it had
        going on ended with it. Read under the board lock, so a row being
        retired (``_retire``) is never counted both in its file and in the
        retired total.
        """
        found = []
        with _locked(self._lock_fd):
            for path in self.folder.glob("metrics-*.json"):
                row = path.stem.removeprefix("metrics-")
                if row == str(self.row):
                    continue
                with contextlib.suppress(OSError, ValueError):
                    numbers = json.loads(path.read_text())
                    if not row.isdigit() or not self._held(int(row)):
                        numbers.pop("gauges", None)
                    found.append(numbers)
        return found

    def leave(self) -> None:
        """Give the row up (its counts with it); the worker is stopping."""
        with _locked(self._lock_fd):
            self._view[self.row * _WIDTH + _ACTIVE] = self._view[self.row * _WIDTH + _QUEUED] = 0
            _retire(self.folder, self.row)
        self._close_fds()
        self._view.release()
        self._memory.close()

    def _close_fds(self) -> None:
        _JOINED.discard(self)
        for fd in (*self._peers.values(), self._row_fd, self._lock_fd):
            os.close(fd)
        self._peers.clear()

    def _rows(self) -> range:
        return range(self._view[_HIGH_WATER])

    def _sum(self) -> tuple[int, int]:
        view, active, queued = self._view, 0, 0
        for row in self._rows():
            active += view[row * _WIDTH + _ACTIVE]
            queued += view[row * _WIDTH + _QUEUED]
        return active, queued

    def _sweep(self) -> None:
        """Zero the rows of workers that died (their row lock is free)."""
        view = self._view
        for row in self._rows():
            counted = view[row * _WIDTH + _ACTIVE] or view[row * _WIDTH + _QUEUED]
            if row != self.row and counted and not self._held(row):
                view[row * _WIDTH + _ACTIVE] = view[row * _WIDTH + _QUEUED] = 0

    def _held(self, row: int) -> bool:
        if self._view[row * _WIDTH + _PID] == _GONE:
            return False  # its lock lives on in a child its worker forked from C
        fd = self._peers.get(row)
        if fd is None:
            fd = self._peers[row] = os.open(
                self.folder / f"row-{row}.lock", os.O_RDWR | os.O_CREAT, 0o600
            )
        if _try_lock(fd):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True


_JOINED: weakref.WeakSet[SlotBoard] = weakref.WeakSet()


def _forget_boards() -> None:
    # A child forked by environment code (a multiprocessing pool, say) shares the
    # open file of its worker's row lock, and so the lock itself: were it to keep
    # it, a worker killed before that child ends would look alive, its slots
    # counted for ever. The child has no use for the board.
    for board in list(_JOINED):
        board._close_fds()


os.register_at_fork(after_in_child=_forget_boards)


def forget_worker(folder: str | Path, pid: int) -> None:
    """Count the rows of worker ``pid``, which has died, as free on every board in ``folder``.

    The supervisor calls it as it sees a worker die. Its row lock is what
    tells the others, but a child the worker forked from C (where the at-fork
    hook that drops the lock does not run) keeps that lock held for as long
    as it lives, and the dead worker's slots with it.
    """
    for path in Path(folder).glob("*/board"):
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDWR)
            try:
                with _locked(fd):
                    size = os.fstat(fd).st_size
                    if size < (_HIGH_WATER + 1) * 8:
                        continue
                    with mmap.mmap(fd, size) as memory:
                        view = memoryview(memory).cast("q")
                        for row in range(view[_HIGH_WATER]):
                            if view[row * _WIDTH + _PID] == pid:
                                view[row * _WIDTH + _PID] = _GONE
                                view[row * _WIDTH + _ACTIVE] = view[row * _WIDTH + _QUEUED] = 0
                                _retire(path.parent, row)
                        view.release()
            finally:
                os.close(fd)


def remove_if_unused(folder: str | Path) -> bool:
    """Remove the boards in ``folder`` if no live worker holds a row of any of them.

    The supervisor removes its boards when it ends; one killed outright cannot,
    and its orphaned workers are the only ones left who know the folder. Each
    checks as it stops, having let go of its own rows, so the last one out
    finds every row free and removes it. This process's rows count as free:
    it calls this on its way out.
    """
    if not Path(folder).is_dir():  # the supervisor removed it as it ended after all
        return False
    _forget_boards()
    for lock in Path(folder).glob("*/row-*.lock"):
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:  # removed meanwhile by another worker on its way out
            continue
        try:
            if not _try_lock(fd):
                return False
        finally:
            os.close(fd)  # closing it releases the lock just taken
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _retire(folder: Path, row: int) -> None:
    """Fold a row's last published counters into those of workers gone (board lock held).

    Counters only grow: a replaced worker's steps and errors still count.
    """
    path = folder / f"metrics-{row}.json"
    with contextlib.suppress(FileNotFoundError):
        gone = json.loads(path.read_text())
        gone.pop("gauges", None)  # what the worker had going on is over
        retired = folder / "metrics-retired.json"
        with contextlib.suppress(FileNotFoundError):
            gone = add_numbers(gone, json.loads(retired.read_text()))
        staged = retired.with_suffix(".tmp")
        staged.write_text(json.dumps(gone))
        os.replace(staged, retired)
        path.unlink()


def add_numbers(a: Any, b: Any) -> Any:
    """Add two trees of counters: numbers add, lists add item by item, dicts key by key.

    >>> add_numbers({"steps": 2, "errors": {"X": 1}, "buckets": [1, 2]},
    ...             {"steps": 3, "errors": {"Y": 1}, "buckets": [0, 5]})
    {'steps': 5, 'errors': {'X': 1, 'Y': 1}, 'buckets': [1, 7]}
    >>> add_numbers({"gauges": {"paused": 1}}, {})  # a part one side lacks
    {'gauges': {'paused': 1}}
    """
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, dict) and isinstance(b, dict):
        return {key: add_numbers(a.get(key), b.get(key)) for key in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list):
        return [add_numbers(x, y) for x, y in zip(a, b, strict=True)]
    return a + b


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    # Held for microseconds (a read of a few rows): blocking the loop is cheaper
    # than a thread hop.
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
