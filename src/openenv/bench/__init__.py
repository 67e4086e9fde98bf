"""A closed-loop load generator for any openenv (or OpenEnv-compatible) server.

Every session connects, resets, waits until all sessions are ready, then
sends a step, waits for its reply, and sends the next, until it has taken
``steps`` steps or ``duration`` seconds are over. ``run_bench`` returns a
``BenchReport`` with steps/s, latency and connect-time percentiles and
errors by code. ``openenv bench URL`` is the same from the command line.

>>> from openenv.bench import run_bench
>>> from openenv.testing import run_server
>>> from echo_env.server.app import app
>>> with run_server(app) as url:
...     report = run_bench(url, sessions=4, steps=25, action={"message": "hi"})
>>> report.steps, report.sessions_ok, dict(report.errors)
(100, 4, {})
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from openenv.bench._run import Run, SessionStats, now
from openenv.bench.report import BenchReport, percentile
from openenv.client import http_url, ws_url
from openenv.client._base import auth_headers, http_detail
from openenv.client.pool import as_pool
from openenv.errors import AuthenticationError, CapacityError, ConnectionFailedError
from openenv.runtime.random_agent import sample_schema

__all__ = ["BenchProgress", "BenchReport", "ClientName", "bench", "percentile", "run_bench"]

ClientName = Literal["auto", "picows", "websockets"]
Phase = Literal["connecting", "warmup", "measuring", "closing"]
_Driver = Callable[[Run, str, SessionStats, float], Awaitable[None]]


@dataclass(frozen=True)
class BenchProgress:
    """A snapshot for a live progress line, taken every ``progress_interval`` seconds."""

    phase: Phase
    elapsed: float
    ready: int
    sessions: int
    replies: int
    rate: float
    errors: int


async def bench(
    url: str,
    *,
    sessions: int = 16,
    steps: int | None = None,
    duration: float | None = None,
    warmup: float = 0.0,
    action: dict[str, Any] | None = None,
    client: ClientName = "auto",
    connect_timeout: float = 30.0,
    reply_timeout: float = 60.0,
    progress: Callable[[BenchProgress], None] | None = None,
    progress_interval: float = 0.5,
    notice: Callable[[str], None] | None = None,
) -> BenchReport:
    """Drive ``sessions`` closed-loop sessions against ``url``; see the module docstring.

    Args:
        url: ``http(s)://host:port`` or ``ws(s)://host:port/ws``; several
            joined by commas to spread the sessions over servers by free room.
        sessions: Concurrent sessions (connections).
        steps: Measured steps per session; exclusive with ``duration``.
        duration: Seconds to measure for (default 10 when ``steps`` is not given).
        warmup: Seconds of stepping before measuring starts; not counted.
        action: The ``data`` of every step frame (default: one valid action
            drawn from the server's ``/schema``). An episode that ends is reset.
        client: ``picows`` (cheapest per step; ``pip install 'openenv-scale[bench]'``),
            ``websockets``, or ``auto`` (picows when installed).
        connect_timeout: Seconds for TCP connect plus WebSocket handshake.
        reply_timeout: Seconds to wait for any reply before dropping the session.
        progress: Called with a ``BenchProgress`` every ``progress_interval`` seconds.
        progress_interval: Seconds between progress calls and reply-timeout sweeps.
        notice: Called with a warning before the run starts (e.g. more
            sessions than the server has slots).

    Raises:
        ValueError: both ``steps`` and ``duration``, or a value out of range.
        ImportError: ``client="picows"`` but picows is not installed.
        ConnectionFailedError: nothing answers at ``url`` (no server there).
    """
    if steps is not None and duration is not None:
        raise ValueError("pass either steps or duration, not both")
    if steps is None and duration is None:
        duration = 10.0
    if (
        sessions < 1
        or (steps is not None and steps < 1)
        or (duration is not None and duration <= 0)
    ):
        raise ValueError("sessions and steps must be >= 1, duration > 0")
    if warmup < 0:
        raise ValueError("warmup must be >= 0")
    name, driver = _driver(client)
    pool = as_pool(url)
    target = ws_url(url) if pool is None else ",".join(pool.urls)
    cap, schema = await _look_first(url if pool is None else pool.urls, connect_timeout)
    if action is None:
        # A valid action, drawn once from the server's schema (as RandomAgent would).
        action = sample_schema(schema, random.Random(0)) if schema else {}
    if notice is not None and cap is not None and sessions > cap:
        notice(
            f"--sessions {sessions} is more than the server's {cap} session slots: "
            f"{sessions - cap} will be refused (or wait in line, if the server queues)"
        )
    _raise_open_files_limit(sessions + 64)
    run = Run(sessions, steps, duration, warmup, action or {})
    stats = [SessionStats() for _ in range(sessions)]

    async def session(stats: SessionStats) -> None:
        # Several servers: each session goes to the one with most room.
        where = target
        if pool is not None:
            try:
                where = await pool.place()
            except (CapacityError, ConnectionFailedError) as exc:
                stats.errored = True
                full = isinstance(exc, CapacityError)
                run.error("CAPACITY_REACHED" if full else "CONNECT_FAILED", str(exc))
                run.session_ready()
                return
        await driver(run, where, stats, connect_timeout)

    tasks = [asyncio.ensure_future(session(s)) for s in stats]
    ticker = asyncio.ensure_future(_tick(run, stats, reply_timeout, progress, progress_interval))
    try:
        await run.all_ready.wait()
        stepping_from = run.start_stepping()
        run.go.set()
        await asyncio.sleep(warmup)
        run.begin_measuring()
        if duration is not None:
            await asyncio.sleep(max(0.0, run.measure_until - now()))
            run.stop()
        await asyncio.gather(*tasks)
        if duration is None:
            run.cpu_until = time.process_time()
    finally:
        ticker.cancel()
        for task in tasks:
            task.cancel()
    end = run.measure_until if duration is not None else max(run.last_measured, run.measure_from)
    elapsed = max(0.0, end - max(run.measure_from, stepping_from))
    return BenchReport(
        url=target,
        sessions=sessions,
        client=name,
        steps=len(run.latencies),
        elapsed=elapsed,
        latencies=sorted(run.latencies),
        connect_times=sorted(run.connect_times),
        setup_time=run.setup_time,
        sessions_ok=sum(s.ok for s in stats),
        errors=run.errors,
        error_samples=run.error_samples,
        client_cpu=(run.cpu_until - run.cpu_from) / elapsed if elapsed > 0 else 0.0,
    )


async def _look_first(
    urls: str | tuple[str, ...], timeout: float
) -> tuple[int | None, dict[str, Any] | None]:
    """The session cap of the servers that answer and the action's JSON Schema, before any load.

    Raises ``ConnectionFailedError`` when nothing answers, so a run against a
    wrong address is one line of error, not a table of failed sessions. Of
    several servers (a pool), those down are passed over, as the pool does.
    """
    import httpx

    roots = [http_url(u) for u in ((urls,) if isinstance(urls, str) else urls)]
    caps: list[int] = []
    answered = 0
    down: ConnectionFailedError | None = None
    schema: dict[str, Any] | None = None
    headers = auth_headers()
    async with httpx.AsyncClient(timeout=timeout, verify=False, headers=headers) as http:
        for root in roots:
            try:
                health = await http.get(f"{root}/health")
                # /health is open to all; /schema needs the key the sessions will send.
                answer = await http.get(f"{root}/schema")
            except httpx.HTTPError as exc:
                down = down or ConnectionFailedError(root, str(exc) or type(exc).__name__)
                continue
            answered += 1
            if answer.status_code == 401:
                raise AuthenticationError(
                    root, f"{http_detail(answer)}; set OPENENV_API_KEY to the server's key"
                )
            with contextlib.suppress(ValueError, TypeError, KeyError):
                caps.append(int(health.json()["max_sessions"]))
            if schema is None:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    found = answer.json()["action"]
                    schema = found if isinstance(found, dict) else None
    if not answered:
        assert down is not None
        raise down
    return (sum(caps) if len(caps) == answered else None), schema


def run_bench(url: str, **options: Any) -> BenchReport:
    """``bench`` on a fresh event loop (uvloop when installed); takes the same options."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(bench(url, **options))


def _driver(client: ClientName) -> tuple[str, _Driver]:
    if client == "auto":
        client = "picows" if importlib.util.find_spec("picows") is not None else "websockets"
    if client == "picows":
        try:
            from openenv.bench import _picows
        except ImportError as exc:
            raise ImportError(
                "the picows load generator needs picows: pip install 'openenv-scale[bench]'"
            ) from exc
        return client, _picows.run_session
    if client == "websockets":
        from openenv.bench import _websockets

        return client, _websockets.run_session
    raise ValueError(f"unknown client {client!r}; use auto, picows or websockets")


async def _tick(
    run: Run,
    stats: list[SessionStats],
    reply_timeout: float,
    progress: Callable[[BenchProgress], None] | None,
    interval: float,
) -> None:
    """Report progress and drop sessions whose reply is overdue."""
    last_replies, last_time = 0, now()
    while True:
        await asyncio.sleep(interval)
        current = now()
        overdue = current - reply_timeout
        for s in stats:
            if 0 < s.sent < overdue and not s.finished and not s.errored and s.abort:
                s.errored = True
                run.error("TIMEOUT", f"no reply within {reply_timeout}s")
                s.abort()
        if progress is None:
            continue
        phase: Phase
        if not run.go.is_set():
            phase = "connecting"
        elif run.stopping or current > run.measure_until:
            phase = "closing"
        else:
            phase = "warmup" if current < run.measure_from else "measuring"
        rate = (run.total_replies - last_replies) / (current - last_time)
        last_replies, last_time = run.total_replies, current
        progress(
            BenchProgress(
                phase=phase,
                elapsed=current - run.started,
                ready=run.ready,
                sessions=run.sessions,
                replies=run.total_replies,
                rate=rate,
                errors=sum(run.errors.values()),
            )
        )


def _raise_open_files_limit(needed: int) -> None:
    """Lift the soft limit on open files towards the hard one: one socket per session."""
    if sys.platform == "win32":
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
