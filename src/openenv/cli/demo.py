"""``openenv demo``: serve an environment and play many parallel episodes through ``Runners``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from openenv.runtime import EpisodeSession, RunConfig, Runners, Task
from openenv.runtime.random_agent import sample_schema

__all__ = ["DemoReport", "drive", "serve_subprocess"]


@dataclass
class DemoReport:
    """What a demo run measured."""

    sessions: int
    steps: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    failed_sessions: int = 0

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.elapsed if self.elapsed else 0.0

    def percentile(self, q: float) -> float:
        if len(self.latencies) < 2:
            return self.latencies[0] if self.latencies else 0.0
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[int(q) - 1]


@contextlib.contextmanager
def serve_subprocess(
    app: str, app_dir: Path | None, max_sessions: int, startup_timeout: float = 30.0
) -> Iterator[str]:
    """Run ``uvicorn APP`` in a child process on a free loopback port; yield its URL.

    The parent binds the socket and hands its descriptor to uvicorn, so the
    port is never raced for, and stops the child with SIGINT (a clean shutdown).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    port = sock.getsockname()[1]
    command = [sys.executable, "-m", "uvicorn", app, "--fd", str(sock.fileno())]
    command += ["--log-level", "warning", "--backlog", "2048"]
    if app_dir is not None:
        command += ["--app-dir", str(app_dir)]
    env = {**os.environ, "OPENENV_MAX_CONCURRENT_ENVS": str(max_sessions)}
    proc = subprocess.Popen(command, pass_fds=[sock.fileno()], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, startup_timeout)
        yield url
    finally:
        sock.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError("the server did not stop within 15 s of SIGINT") from None
        if proc.returncode != 0:
            raise RuntimeError(f"the server exited with code {proc.returncode}")


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited during startup (code {proc.returncode})")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer /health within {timeout}s") from None
            time.sleep(0.05)


async def drive(url: str, sessions: int, steps: int, progress: bool | None = None) -> DemoReport:
    """Run ``sessions`` concurrent episodes of ``steps`` steps each through ``Runners``.

    Each episode is a task for the local engine; its agent times every step.
    """
    report = DemoReport(sessions=sessions)
    agent = functools.partial(_timed_episode, steps=steps)
    tasks = [Task(id=f"session-{i}", env=url, agent=agent, seed=i) for i in range(sessions)]
    config = RunConfig(max_concurrency=sessions, progress=progress)
    started = time.perf_counter()
    results = await Runners.run_task(tasks, config)
    report.elapsed = time.perf_counter() - started
    for result in results:
        report.steps += result.steps
        if result.ok:
            report.latencies.extend(result.value)
        else:
            report.failed_sessions += 1
            report.errors[result.error.type if result.error else result.status.value] += 1
    return report


async def _timed_episode(session: EpisodeSession, steps: int) -> list[float]:
    """Reset, then send ``steps`` actions; return each step's latency in seconds.

    The actions are drawn from the environment's own action schema, so any app
    plays (a fixed echo message failed every step elsewhere); an episode that
    ends is followed by the next, as an agent's would be.
    """
    schema = await session.action_schema()
    rng = random.Random(session.task.seed)
    result = await session.reset()
    latencies = []
    for _ in range(steps):
        if result.done:
            result = await session.reset()
        action = sample_schema(schema, rng)
        started = time.perf_counter()
        result = await session.step(action)
        latencies.append(time.perf_counter() - started)
    return latencies


def render(report: DemoReport, console: Console) -> None:
    table = Table(title="openenv demo", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("sessions", f"{report.sessions} ({report.failed_sessions} failed)")
    table.add_row("steps", f"{report.steps:,}")
    table.add_row("wall time", f"{report.elapsed:.2f} s")
    table.add_row("steps/s", f"{report.steps_per_second:,.0f}")
    table.add_row("p50 step latency", f"{report.percentile(50) * 1000:.2f} ms")
    table.add_row("p99 step latency", f"{report.percentile(99) * 1000:.2f} ms")
    errors = ", ".join(f"{name}: {n}" for name, n in report.errors.items()) or "none"
    table.add_row("errors", errors)
    console.print(table)


def run_demo(
    app: str, app_dir: Path | None, sessions: int, steps: int, console: Console
) -> DemoReport:
    with serve_subprocess(app, app_dir, max_sessions=sessions) as url:
        console.print(f"serving [bold]{app}[/] at {url}; {sessions} sessions x {steps} steps")
        report = asyncio.run(drive(url, sessions, steps))
    console.print("server stopped cleanly")
    render(report, console)
    return report
