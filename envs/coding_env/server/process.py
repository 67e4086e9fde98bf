"""A child process started off the event loop and watched from it (Linux).

``loop.subprocess_exec`` forks on the loop thread; under uvloop that is a
full ``fork()`` of the server, whose cost grows with its memory, and with a
few hundred programs starting at once it stalls every session for seconds.
Here ``subprocess.Popen`` runs in a worker thread instead (CPython spawns
with ``vfork``), the exit is observed through a pidfd the loop polls, and
the output pipes are read with ``add_reader``. Signals go through the pidfd
too, so they can never reach a recycled pid.

>>> import asyncio
>>> async def main() -> tuple[bytes, int]:
...     child = await ChildProcess.start(["/bin/echo", "hi"])
...     out = await child.stdout.read()
...     await child.exited
...     return out, await child.aclose()
>>> asyncio.run(main())
(b'hi\\n', 0)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["ChildProcess", "PipeReader"]


class PipeReader:
    """The read end of a pipe, read from the event loop; its fd is closed exactly once.

    Not ``loop.connect_read_pipe``: uvloop's transport closes the fd and then
    the file object closes it again, which, with threads opening files at the
    same time, can close someone else's fd.
    """

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._loop = asyncio.get_running_loop()

    async def read(self, size: int = 65536) -> bytes:
        """Up to ``size`` bytes, as soon as there are any; ``b""`` at the end."""
        while True:
            try:
                return os.read(self._fd, size)
            except BlockingIOError:
                pass
            await self._readable()

    async def discard(self, size: int = 2**20) -> int:
        """Drop up to ``size`` bytes, as soon as there are any; how many (0 at the end).

        Spliced to ``/dev/null``: the kernel frees the pipe's pages without
        copying them here, so draining a flood costs the server little.
        """
        while True:
            try:
                return os.splice(self._fd, _dev_null(), size, flags=os.SPLICE_F_NONBLOCK)
            except BlockingIOError:
                pass
            await self._readable()

    async def _readable(self) -> None:
        readable = self._loop.create_future()
        self._loop.add_reader(self._fd, _set_once, readable)
        try:
            await readable
        finally:
            self._loop.remove_reader(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


@functools.cache
def _dev_null() -> int:
    # One for the whole process, never closed: nothing is ever read from it.
    return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ChildProcess:
    """One child: its output streams, a future set when it exits, and signals."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout_fd: int, stderr_fd: int) -> None:
        self.pid = popen.pid
        self._popen = popen
        self._loop = asyncio.get_running_loop()
        self._pidfd = os.pidfd_open(popen.pid)
        self.exited: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(self._pidfd, self._on_exit)
        self.stdout = PipeReader(stdout_fd)
        self.stderr = PipeReader(stderr_fd)

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> ChildProcess:
        """Start ``argv`` with stdin from /dev/null and stdout/stderr piped to us."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        popen_call = functools.partial(
            subprocess.Popen,
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            cwd=cwd,
            env=env,
            pass_fds=tuple(pass_fds),
        )
        future = asyncio.get_running_loop().run_in_executor(None, popen_call)
        try:
            popen = await asyncio.shield(future)
        except asyncio.CancelledError:
            # It starts anyway, and nobody else will know of it: stop it first.
            child = cls(await future, out_r, err_r)
            await child.terminate(grace=5.0)
            await child.aclose()
            raise
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        return cls(popen, out_r, err_r)

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._pidfd)
        if not self.exited.done():
            self.exited.set_result(None)

    def send_signal(self, signum: int) -> None:
        """Signal the child (never another process that reused its pid)."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, signum)

    async def terminate(self, grace: float) -> bool:
        """SIGTERM, then SIGKILL to its group after ``grace`` s; whether SIGTERM sufficed."""
        self.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self.exited), grace)
            return True
        except TimeoutError:
            self.kill_group()
            await self.exited
            return False

    def kill_group(self) -> None:
        """SIGKILL the child's process group (its pid stays reserved until we reap it)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # it made no group of its own
            self.send_signal(signal.SIGKILL)

    async def aclose(self) -> int:
        """Close the pipes, reap the child (killing it if it still runs); its exit code."""
        self.stdout.close()
        self.stderr.close()
        if not self.exited.done():
            self.kill_group()
            await self.exited
        returncode = self._popen.wait()  # it has exited: this does not block
        os.close(self._pidfd)
        return returncode
