"""Where ``openenv serve --workers N`` keeps its slot board, and removing those left behind.

The supervisor removes its board's folder as it ends, and workers it left
behind remove it as the last of them stops (``slot_board.remove_if_unused``). A
server killed all at once (SIGKILL to its process group, the OOM killer, a
container's hard stop with ``/dev/shm`` mounted from the host) leaves it: no
later server uses it, but they pile up in memory. So each folder's name says
whose it is: the supervisor's pid namespace, pid and the time that process
started (a pid used again by another process starts at another time), and a
new supervisor removes the folders of this user whose supervisor is provably
gone and of which no worker holds a row. One whose name does not say (made by
an older openenv, or on a system without ``/proc``) is left alone.

>>> import tempfile
>>> parent = tempfile.mkdtemp()
>>> board = new_board_folder(parent)
>>> new_board_folder(parent) != board and os.path.isdir(board)  # its supervisor is alive
True
>>> shutil.rmtree(parent)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

__all__ = ["new_board_folder"]

_PREFIX = "openenv-slots-"
_OWNED = re.compile(rf"{_PREFIX}(\d+)-(\d+)-(\d+)-")


def new_board_folder(parent: str) -> str:
    """Remove the boards in ``parent`` that servers killed outright left, and make
    a new one named for this process."""
    for path in Path(parent).glob(f"{_PREFIX}*"):
        if _left_behind(path):
            shutil.rmtree(path, ignore_errors=True)
    me = _identity(os.getpid())
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{me}-" if me else _PREFIX, dir=parent)


def _left_behind(path: Path) -> bool:
    owner = _OWNED.match(path.name)
    if owner is None:  # not named for its supervisor: whether it lives cannot be told
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    # Another user's process may be hidden from this one (/proc's hidepid): its own.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return False
    if owner[1] != _namespace():  # its pid is another namespace's: nothing is proven
        return False
    if _identity(int(owner[2])) == owner[0].removeprefix(_PREFIX).rstrip("-"):
        return False  # its supervisor is alive (or dead, not yet reaped)
    # Workers the supervisor left may still be draining on it: the last of them removes it.
    return not any(_held(lock) for lock in path.glob("*/row-*.lock"))


def _identity(pid: int) -> str | None:
    """``namespace-pid-start`` of a live process of this pid namespace, or None."""
    try:
        # The 22nd field, the start time; counted from the 3rd, the first after the name.
        started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    namespace = _namespace()
    return None if namespace is None else f"{namespace}-{pid}-{started}"


def _namespace() -> str | None:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def _held(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:  # removed meanwhile by a worker on its way out
        return False
    try:
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False  # closing it releases the lock just taken
        return True
    finally:
        os.close(fd)
