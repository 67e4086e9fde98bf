"""Run untrusted Python in a separate process, within limits, without blocking the loop.

Each run gets a fresh temporary directory (removed afterwards), a minimal
environment with nothing of the server's (no secrets), ``python -I -S``
(isolated mode, standard library only) and the resource limits of
``SandboxLimits``. When the server runs as root, each run also gets a uid of
its own (``identities.UidPool``), which is what makes the process limit
apply, and lets every process of the run be killed at once.

A supervisor process (``launcher.py``) sits between the server and the
program: it applies the limits, reaps and kills everything the program
starts, and reports the program's exit code. The server starts it off the
event loop (``process.py``), reads the output incrementally, up to the
limit, and enforces the wall clock.

>>> import asyncio
>>> result = asyncio.run(Sandbox(SandboxLimits(timeout=5)).run_code("print(6 * 7)"))
>>> result.status, result.exit_code, result.stdout
('ok', 0, '42\\n')
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coding_env.models import ExecutionResult, Status
from coding_env.server.identities import Lease, UidPool
from coding_env.server.launcher import CHANNEL_FD
from coding_env.server.process import ChildProcess, PipeReader

__all__ = ["CHANNEL_FD", "Sandbox", "SandboxLimits", "default_python", "shared_uid_pool"]

logger = logging.getLogger("coding_env.sandbox")

_LAUNCHER = (Path(__file__).parent / "launcher.py").read_text(encoding="utf-8")
_MIB = 2**20
# How long the supervisor gets to kill and reap everything before it is killed itself.
_STOP_GRACE = 5.0
# What is kept of a run's channel (the rest is discarded): room for a report
# of many tests, and for whatever else the program sent there before it.
_CHANNEL_BYTES = 2**20


class SandboxLimits(BaseModel):
    """What one run may use.

    >>> SandboxLimits(timeout=2, memory_bytes=64 * 2**20).max_processes
    16
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float = Field(default=10.0, gt=0, description="Wall-clock seconds before a kill.")
    cpu_seconds: int = Field(default=10, ge=1, description="CPU seconds (RLIMIT_CPU).")
    memory_bytes: int = Field(
        default=512 * _MIB, ge=32 * _MIB, description="Address space per process (RLIMIT_AS)."
    )
    max_processes: int = Field(
        default=16,
        ge=1,
        description="Processes and threads of the program and its children (RLIMIT_NPROC).",
    )
    max_output_bytes: int = Field(
        default=64 * 1024, ge=1, description="Bytes kept per stream; more kills the program."
    )
    max_file_bytes: int = Field(
        default=16 * _MIB, ge=0, description="Largest file the program may write (RLIMIT_FSIZE)."
    )
    max_open_files: int = Field(default=64, ge=8, description="Open files (RLIMIT_NOFILE).")
    nice: int = Field(
        default=19,
        ge=0,
        le=19,
        description="Scheduling niceness: busy programs leave the CPU to the server first.",
    )

    @classmethod
    def from_env(cls, **defaults: Any) -> SandboxLimits:
        """``defaults``, overridden by ``CODING_ENV_<FIELD>`` variables (``CODING_ENV_TIMEOUT``).

        >>> import os
        >>> os.environ["CODING_ENV_MEMORY_BYTES"] = str(64 * 2**20)
        >>> SandboxLimits.from_env(timeout=5).memory_bytes // 2**20
        64
        >>> del os.environ["CODING_ENV_MEMORY_BYTES"]
        """
        values = dict(defaults)
        for name in cls.model_fields:
            if (raw := os.environ.get(f"CODING_ENV_{name.upper()}")) is not None:
                values[name] = raw
        return cls.model_validate(values)


@functools.cache
def shared_uid_pool() -> UidPool:
    """The uids of this server process's runs (when it is root)."""
    return UidPool()


def default_python(drop_privileges: bool) -> str:
    """The interpreter for sandboxed programs: ``$CODING_ENV_PYTHON``, else the server's own.

    A program running under an unprivileged uid can only start an interpreter
    every user may reach (not one under ``/root``, say); then the first of
    the server's, ``/usr/bin/python3`` and ``/usr/local/bin/python3`` that is.
    """
    if configured := os.environ.get("CODING_ENV_PYTHON"):
        return configured
    if not drop_privileges:
        return sys.executable
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and _anyone_can_run(candidate):
            return candidate
    raise RuntimeError(
        f"no Python interpreter that an unprivileged user may run: {sys.executable} is not "
        f"reachable by others; install one (e.g. apt-get install python3) or set "
        f"CODING_ENV_PYTHON"
    )


def _anyone_can_run(path: str) -> bool:
    target = Path(os.path.realpath(path))
    try:
        if not target.stat().st_mode & stat.S_IXOTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in target.parents)
    except OSError:
        return False


class Sandbox:
    """Runs programs under ``limits``; one instance may run many at once.

    Args:
        limits: What each run may use.
        python: The interpreter for programs (default: ``default_python``).
        uids: Where per-run uids come from when the server is root (default:
            one pool per server process). Ignored otherwise.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        python: str | None = None,
        uids: UidPool | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.drop_privileges = os.geteuid() == 0
        self.uids = (uids or shared_uid_pool()) if self.drop_privileges else None
        self.python = python or default_python(self.drop_privileges)

    async def run_code(self, code: str) -> ExecutionResult:
        """Run ``code`` as ``solution.py``."""
        return await self.run({"solution.py": code}, "solution.py")

    async def run(
        self, files: Mapping[str, str], script: str, *, kill_on_flood: bool = True
    ) -> ExecutionResult:
        """Write ``files`` into a fresh directory and run ``python -I -S script`` there.

        Output past ``max_output_bytes`` is discarded; with ``kill_on_flood``
        the program is also killed (status ``output_limit``), else it runs on
        and ends as it would have, its result marked truncated.
        """
        execution, _ = await self._run(files, script, kill_on_flood, channel=False)
        return execution

    async def run_with_channel(
        self, files: Mapping[str, str], script: str, *, kill_on_flood: bool = True
    ) -> tuple[ExecutionResult, bytes]:
        """As ``run``, the program also having a pipe to the server as fd ``CHANNEL_FD``.

        Returns what the program wrote there (up to 1 MiB, the rest discarded;
        never a reason to stop it). Its stdout and stderr cannot reach the
        channel, but it may write to fd 3 itself: a message sent on it must
        carry its own proof of origin.
        """
        execution, channel = await self._run(files, script, kill_on_flood, channel=True)
        return execution, channel or b""

    async def _run(
        self, files: Mapping[str, str], script: str, kill_on_flood: bool, channel: bool
    ) -> tuple[ExecutionResult, bytes | None]:
        lease = await self._lease()
        workdir: str | None = None
        try:
            workdir = tempfile.mkdtemp(prefix="coding-env-")
            for name, text in files.items():
                (Path(workdir) / name).write_text(text, encoding="utf-8")
                if lease:
                    os.chown(Path(workdir) / name, lease.uid, lease.gid)
            if lease:
                os.chown(workdir, lease.uid, lease.gid)
            return await self._execute(workdir, script, lease, kill_on_flood, channel)
        finally:
            # Shielded: a cancelled caller must not leave the directory or the uid behind.
            await asyncio.shield(asyncio.create_task(self._clean_up(workdir, lease)))

    async def _lease(self) -> Lease | None:
        if self.uids is None:
            return None
        uids = self.uids
        future = asyncio.get_running_loop().run_in_executor(None, uids.acquire)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The uid may be claimed anyway, once nobody waits for it: give it back.
            future.add_done_callback(
                lambda done: done.exception() is None and uids.release(done.result())
            )
            raise

    async def _clean_up(self, workdir: str | None, lease: Lease | None) -> None:
        try:
            if lease is not None and self.uids is not None:
                # Every run's uid is swept, however the run ended, and before its
                # directory is removed: the program runs under that uid as its
                # launcher does, so it may have killed the launcher and left
                # setsid() children to PID 1, which could go on filling the
                # directory faster than it is removed. A uid is the one thing
                # it cannot shed.
                await asyncio.to_thread(self.uids.sweep, lease)
            if workdir is not None:
                await asyncio.to_thread(_remove_tree, workdir)
        finally:
            if lease is not None and self.uids is not None:
                await asyncio.to_thread(self.uids.release, lease)

    async def _execute(
        self, workdir: str, script: str, lease: Lease | None, kill_on_flood: bool, channel: bool
    ) -> tuple[ExecutionResult, bytes | None]:
        limits = self.limits
        report_r, report_w = os.pipe()
        channel_r, channel_w = os.pipe() if channel else (None, None)
        pass_fds: Sequence[int] = (report_w,) if channel_w is None else (report_w, channel_w)
        config = {
            "status_fd": report_w,
            "channel_fd": channel_w,
            "uid": lease.uid if lease else None,
            "gid": lease.gid if lease else None,
            "argv": [self.python, "-I", "-S", script],
            "limits": limits.model_dump(exclude={"timeout", "max_output_bytes"}),
        }
        argv = [self.python, "-I", "-S", "-c", _LAUNCHER, json.dumps(config)]
        try:
            try:
                child = await ChildProcess.start(
                    argv, cwd=workdir, env=_environment(workdir), pass_fds=pass_fds
                )
            finally:
                for fd in pass_fds:
                    os.close(fd)
            reader = PipeReader(channel_r) if channel_r is not None else None
            channel_r = None
            run = _Run(child, limits, lease, self.uids, kill_on_flood, reader)
            stopped_for = await run.supervise()
            report = _read_report(report_r)
        finally:
            os.close(report_r)
            if channel_r is not None:
                os.close(channel_r)
        execution = _result(stopped_for, report, run, limits, workdir)
        return execution, bytes(run.channel.data) if run.channel else None


class _Capture:
    """One output stream, kept up to the limit; what is read survives a cancel."""

    def __init__(self, limit: int, flooded: asyncio.Event | None) -> None:
        self.data = bytearray()
        self.truncated = False
        self._limit = limit
        self._flooded = flooded

    async def pump(self, stream: PipeReader) -> None:
        """Read to the end; past the limit, discard (and say so, if a flood stops the run)."""
        while not self.truncated:
            chunk = await stream.read(65536)
            if not chunk:
                return
            room = self._limit - len(self.data)
            self.data += chunk[: max(room, 0)]
            if len(chunk) > room:
                self.truncated = True
                if self._flooded is not None:
                    self._flooded.set()
        # A run that is not stopped for its flood must still be drained, or it
        # would block on a full pipe until its timeout.
        while await stream.discard():
            pass

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class _Run:
    """The server's side of one run: the wall clock, the output, stopping it."""

    def __init__(
        self,
        child: ChildProcess,
        limits: SandboxLimits,
        lease: Lease | None,
        uids: UidPool | None,
        kill_on_flood: bool,
        channel: PipeReader | None,
    ) -> None:
        self.child = child
        self.limits = limits
        self.lease = lease
        self.uids = uids
        self.kill_on_flood = kill_on_flood
        self.flooded = asyncio.Event()
        flooded = self.flooded if kill_on_flood else None
        self.stdout = _Capture(limits.max_output_bytes, flooded)
        self.stderr = _Capture(limits.max_output_bytes, flooded)
        self._channel_stream = channel
        # Never a reason to stop the run: the program may write there what it likes.
        self.channel = _Capture(_CHANNEL_BYTES, None) if channel else None

    async def supervise(self) -> Status | None:
        """Wait for the run to end; why it was stopped, if it was."""
        child = self.child
        readers = [
            asyncio.create_task(self.stdout.pump(child.stdout)),
            asyncio.create_task(self.stderr.pump(child.stderr)),
        ]
        if self.channel is not None and self._channel_stream is not None:
            readers.append(asyncio.create_task(self.channel.pump(self._channel_stream)))
        flooded = asyncio.create_task(self.flooded.wait())
        stopped_for: Status | None = None
        try:
            await asyncio.wait(
                {child.exited, flooded}, timeout=self.limits.timeout, return_when="FIRST_COMPLETED"
            )
            if self.flooded.is_set():
                stopped_for = "output_limit"
            elif not child.exited.done():
                stopped_for = "timeout"
            if stopped_for is not None:
                await self.stop()
            # Everything of the run is dead now, so the pipes are at their end.
            await asyncio.wait(readers, timeout=_STOP_GRACE)
        finally:
            for task in (*readers, flooded):
                task.cancel()
            # Shielded: cancelled from outside, the run must still be stopped and reaped.
            await asyncio.shield(asyncio.create_task(self._close()))
        return stopped_for

    async def stop(self) -> None:
        """Have the supervisor kill the run; kill the supervisor if it does not answer."""
        if not await self.child.terminate(_STOP_GRACE) and self.lease and self.uids:
            # The program, under the supervisor's uid, may have stopped it: only
            # the supervisor died with its group, so end the rest of the run now.
            await asyncio.to_thread(self.uids.sweep, self.lease)

    async def _close(self) -> None:
        if self._channel_stream is not None:
            self._channel_stream.close()
        if not self.child.exited.done():
            await self.stop()
        await self.child.aclose()


def _environment(workdir: str) -> dict[str, str]:
    # An allow-list, built from scratch: nothing of the server's environment.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
            "LANG": "C.UTF-8"}  # fmt: skip


def _remove_tree(path: str) -> None:
    """Remove a run's directory, however deeply the program nested folders in it."""
    # shutil.rmtree recurses (and holds a descriptor) once per level, so a
    # program that nests a few thousand folders defeats it; rm does not.
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    try:
        subprocess.run(
            ["rm", "-rf", "--", path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    except OSError as exc:
        logger.error("could not remove %s: %s", path, exc)
        return
    if os.path.lexists(path):
        logger.error("could not remove %s", path)


def _read_report(fd: int) -> dict[str, Any] | None:
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return None
    try:
        report = json.loads(data)
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


_SYNTAX = re.compile(r"^(SyntaxError|IndentationError|TabError)\b")


def _result(
    stopped_for: Status | None,
    report: dict[str, Any] | None,
    run: _Run,
    limits: SandboxLimits,
    workdir: str,
) -> ExecutionResult:
    stdout, stderr = run.stdout, run.stderr
    exit_code = report.get("returncode") if report else None
    # Tracebacks name "solution.py", not a random directory the agent never saw.
    out = stdout.text().replace(workdir + os.sep, "")
    err = stderr.text().replace(workdir + os.sep, "")
    last_line = err.rstrip().rpartition("\n")[2]
    status: Status
    if report is not None and report.get("error"):
        status, message = "error", f"the program could not be run: {report['error']}"
    elif run.kill_on_flood and (stdout.truncated or stderr.truncated):
        stream = "stdout" if stdout.truncated else "stderr"
        status = "output_limit"
        message = (
            f"the program wrote more than {limits.max_output_bytes} bytes to {stream}; "
            f"the rest was discarded and the program killed"
        )
    elif stopped_for == "timeout" and (report is None or report.get("stopped")):
        # Without a report too: a program that stops or kills its supervisor (it
        # runs under the same uid) and runs on is still one that ran too long.
        status, message = "timeout", f"the program ran past {limits.timeout:g} s and was killed"
        exit_code = -signal.SIGKILL if report is None else exit_code
    elif report is None:
        # It ran: the program may kill its supervisor, which then cannot report.
        status, message = "error", "the program's supervisor ended without a report"
    elif exit_code == -signal.SIGXCPU:
        status = "cpu_limit"
        message = f"the program used more than {limits.cpu_seconds} s of CPU and was killed"
    elif exit_code == 0:
        status, message = "ok", "the program exited with code 0"
    elif exit_code == 1 and last_line.startswith("MemoryError"):
        status = "memory_limit"
        message = f"the program ran out of memory (limit {limits.memory_bytes // _MIB} MiB)"
    elif exit_code == 1 and _SYNTAX.match(last_line) and "Traceback (most recent" not in err:
        status, message = "syntax_error", f"the program does not compile: {last_line}"
    elif isinstance(exit_code, int) and exit_code < 0:
        status, message = "error", f"the program was killed by {_signal_name(-exit_code)}"
    else:
        status, message = "error", f"the program exited with code {exit_code}"
    streams = (("stdout", stdout), ("stderr", stderr))
    if status != "output_limit" and (cut := [name for name, c in streams if c.truncated]):
        message += (
            f"; it wrote more than {limits.max_output_bytes} bytes to {' and '.join(cut)}, "
            f"and the rest was discarded"
        )
    return ExecutionResult(
        status=status,
        exit_code=exit_code,
        stdout=out,
        stderr=err,
        stdout_truncated=stdout.truncated,
        stderr_truncated=stderr.truncated,
        message=message,
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
