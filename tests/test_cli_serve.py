"""``openenv serve``: refusals in one line, and several worker processes sharing one cap."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_envs import write_env
from dockerfiles import stop, wait_healthy
from typer.testing import CliRunner

from openenv import (
    Action,
    AnyObservation,
    CapacityError,
    SessionClosedError,
    SessionError,
    WebSocketEnvClient,
)
from openenv.cli import app

OPENENV = Path(sys.executable).with_name("openenv")


def refused(*args: str) -> str:
    """Run ``openenv serve ARGS`` in-process; it must fail with one line on stderr."""
    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_folder_that_is_not_an_environment_is_refused(tmp_path: Path) -> None:
    assert refused(str(tmp_path)) == (
        f"error: {tmp_path.resolve()} has no server/app.py; is it an environment folder? "
        f"(create one with: openenv init NAME)"
    )


def test_reload_with_workers_is_refused(tmp_path: Path) -> None:
    folder = str(write_env(tmp_path / "env"))
    line = refused(folder, "--reload", "--workers", "2")
    assert line == "error: --reload runs one process; it cannot be combined with --workers"


def test_an_app_that_would_ignore_the_cap_is_refused(tmp_path: Path) -> None:
    folder = str(write_env(tmp_path / "env", config="ConcurrencyConfig(max_concurrent_envs=8)"))
    line = refused(folder, "--max-sessions", "4")
    assert line.startswith("error: server/app.py ignores OPENENV_MAX_CONCURRENT_ENVS")
    assert "asked for 4 sessions, its app holds 8" in line
    assert "OPENENV_MAX_CONCURRENT_ENVS" not in os.environ


def test_a_busy_port_is_refused(tmp_path: Path) -> None:
    folder = str(write_env(tmp_path / "env"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = refused(folder, "--port", str(port))
    assert line == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_an_app_that_fails_to_import_is_refused(tmp_path: Path) -> None:
    folder = str(write_env(tmp_path / "env", app="raise RuntimeError('no GPU here')\n"))
    assert refused(folder) == ("error: importing server/app.py:1 failed: RuntimeError: no GPU here")


def run_openenv(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real ``openenv`` script in a process of its own; it must end by itself."""
    return subprocess.run(
        [OPENENV, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


@pytest.mark.parametrize(
    ("line", "kind"), [("app = 42", "int"), ("app = None", "NoneType"), ("app = 'x'", "str")]
)
def test_an_app_that_is_not_an_asgi_app_is_refused_before_serving(
    tmp_path: Path, line: str, kind: str
) -> None:
    folder = write_env(tmp_path / "env", app=f"{line}\n")
    result = run_openenv("serve", str(folder), "--port", "0")
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    assert result.stderr == (
        f"error: server/app.py's `app` is a {kind}, not an ASGI app; "
        f"make it with openenv.create_app(...)\n"
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_app_that_fails_to_start_exits_with_an_error(tmp_path: Path, workers: str) -> None:
    """scaling.md: a worker that fails during startup stops the server, not replaced."""
    failing = (
        "import contextlib\n"
        "from fastapi import FastAPI\n\n\n"
        "@contextlib.asynccontextmanager\n"
        "async def lifespan(app):\n"
        "    raise RuntimeError('cannot reach the simulator')\n"
        "    yield\n\n\n"
        "app = FastAPI(lifespan=lifespan)\n"
    )
    folder = write_env(tmp_path / "env", app=failing)
    result = CliRunner().invoke(app, ["serve", str(folder), "--port", "0", "--workers", workers])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the app failed to start (exit code 3); see the log above"
    )


@contextlib.contextmanager
def serving(folder: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    log, out = folder / "serve.log", folder / "serve.out"
    with log.open("wb") as err, out.open("wb") as stdout:
        proc = subprocess.Popen(
            [OPENENV, "serve", str(folder), "--port", "0", *args],
            stdout=stdout,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not (match := re.search(r"at (http://\S+) \(", out.read_text())):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        wait_healthy(match.group(1), proc, log)
        yield match.group(1), proc
    finally:
        stop(proc, signal.SIGINT)


async def open_session(url: str) -> tuple[WebSocketEnvClient, int] | None:
    """Open a session; its pid, or None if the worker that took the connection was full."""
    client = WebSocketEnvClient(url, observation_cls=AnyObservation)
    try:
        result = await client.reset()
    except CapacityError:
        await client.close()
        return None
    return client, (result.observation.model_extra or {})["pid"]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def open_sessions(url: str, n: int) -> list[tuple[WebSocketEnvClient, int]]:
    """Open ``n`` sessions at once; every one must get in."""
    opened = await asyncio.gather(*(open_session(url) for _ in range(n)))
    held = [session for session in opened if session is not None]
    refused = len(opened) - len(held)
    assert refused == 0, f"{refused} of {n} refused"
    return held


async def spread(url: str, held: list[tuple[WebSocketEnvClient, int]]) -> None:
    """Move sessions (closing one, opening another) until both workers hold some:
    which worker accepts a connection is the kernel's choice, and on a loaded
    machine one may take a whole burst."""
    deadline = time.monotonic() + 30
    while len({pid for _, pid in held}) < 2:
        assert time.monotonic() < deadline, "every session kept landing on one worker"
        client, _ = held.pop(0)
        await client.close()
        held.append((await open_sessions(url, 1))[0])


def steps_counted(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return float(re.search(r"^openenv_steps_total (\S+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]


async def steps_ok(sessions: list[tuple[WebSocketEnvClient, int]]) -> bool:
    results = await asyncio.gather(*(client.step(Ping()) for client, _ in sessions))
    return all(result.reward == 1.0 for result in results)


async def eventually(condition: Any, what: str, log: Path, seconds: float = 30) -> None:
    """Poll ``condition`` (blocking, so in a thread) until it holds."""
    deadline = time.monotonic() + seconds
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}\n{await asyncio.to_thread(log.read_text)}")
        await asyncio.sleep(0.05)


class Ping(Action):
    note: str = ""


@pytest.mark.timeout(180)
def test_workers_share_one_cap_and_a_killed_worker_is_replaced(tmp_path: Path) -> None:
    folder = write_env(tmp_path / "env")
    log = folder / "serve.log"

    async def scenario(url: str) -> set[int]:
        await eventually(lambda: health(url).get("workers") == 2, "a worker did not start", log)
        held = await open_sessions(url, 64)  # all at once: any worker, one cap
        try:
            await spread(url, held)
            pids = Counter(pid for _, pid in held)
            assert len(pids) == 2, pids
            assert await open_session(url) is None  # the 65th: the whole server is full
            state = health(url)
            assert (state["status"], state["active_sessions"], state["workers"]) == (
                "healthy",
                64,
                2,
            )

            victim = min(pids)
            os.kill(victim, signal.SIGKILL)
            doomed = [s for s in held if s[1] == victim]
            others = [s for s in held if s[1] != victim]
            for client, _ in doomed:  # their connection ends with the process
                with pytest.raises(SessionClosedError):
                    await client.step(Ping())
                await client.close()
            assert await steps_ok(others)  # the other worker's sessions go on
            held = others

            # A replacement worker appears and the dead one's slots are free again.
            await eventually(
                lambda: (
                    health(url).get("workers") == 2
                    and health(url).get("active_sessions") == len(others)
                ),
                "no replacement worker, or the dead worker's slots stayed taken",
                log,
            )
            held += await open_sessions(url, len(doomed))
            assert await open_session(url) is None
            assert await steps_ok(held)
            return {pid for _, pid in held} | {victim}
        finally:
            await asyncio.gather(*(client.close() for client, _ in held))

    with serving(folder, "--workers", "2", "--max-sessions", "64") as (url, proc):
        assert "(2 workers sharing 64 sessions)" in (folder / "serve.out").read_text()
        pids = asyncio.run(scenario(url))
        assert proc.pid not in pids  # sessions live in the workers, not the supervisor
        assert "starting a replacement" in log.read_text()
        assert stop(proc, signal.SIGINT) == 0
    deadline = time.monotonic() + 20
    while not all(gone(pid) for pid in pids):
        assert time.monotonic() < deadline, "a worker outlived openenv serve"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_ctrl_c_in_a_terminal_drains_every_worker(tmp_path: Path) -> None:
    # A terminal's Ctrl+C signals the whole process group: each worker gets SIGINT
    # from the terminal and SIGTERM from the supervisor, and must still drain.
    folder = write_env(tmp_path / "env")
    log = folder / "serve.log"

    async def scenario(url: str, proc: subprocess.Popen[bytes]) -> list[int | None]:
        await eventually(lambda: health(url).get("workers") == 2, "a worker did not start", log)
        held = await open_sessions(url, 8)
        os.killpg(proc.pid, signal.SIGINT)
        return list(await asyncio.gather(*(how_it_ended(client) for client, _ in held)))

    with serving(folder, "--workers", "2") as (url, proc):
        endings = asyncio.run(scenario(url, proc))
        assert proc.wait(30) == 0
    # Drained, not dropped: told why, or closed with 1001 (going away).
    assert set(endings) <= {"server shutting down", 1001}, endings


async def how_it_ended(client: WebSocketEnvClient) -> str | int | None:
    """Step until the session ends; what the server said, or its close code."""
    try:
        while True:
            await client.step(Ping())
    except SessionError as refused:
        return refused.message
    except SessionClosedError as closed:
        return closed.close_code
    finally:
        # Before asyncio.run closes the loop: a socket the server is closing
        # meanwhile would otherwise be left half-closed, and reported unclosed
        # by whichever later test the garbage collector happens to run in.
        await client.close()


@pytest.mark.timeout(120)
def test_a_connection_waits_in_line_for_a_slot_freed_by_another_worker(tmp_path: Path) -> None:
    queueing = (
        "ConcurrencyConfig(max_concurrent_envs=int(os.environ['OPENENV_MAX_CONCURRENT_ENVS']),"
        " queue_timeout=60)"
    )
    folder = write_env(tmp_path / "env", config=queueing)
    log = folder / "serve.log"

    async def scenario(url: str) -> None:
        await eventually(lambda: health(url).get("workers") == 2, "a worker did not start", log)
        held = await open_sessions(url, 8)
        waiting = [asyncio.ensure_future(open_session(url)) for _ in range(4)]
        await eventually(lambda: health(url).get("queued_sessions") == 4, "not queued", log)
        assert health(url)["active_sessions"] == 8
        # Free one slot on each worker in turn: every waiter gets in, wherever it waits.
        leaving, held = held[:4], held[4:]
        for client, _ in leaving:
            await client.close()
        arrived = await asyncio.gather(*waiting)
        held += [session for session in arrived if session is not None]
        try:
            assert len(held) == 8
            assert (health(url)["active_sessions"], health(url)["queued_sessions"]) == (8, 0)
            assert await steps_ok(held)
            # Any worker's /metrics counts the steps of both (each connection may
            # land on either worker, so ask several times).
            await eventually(
                lambda: {steps_counted(url) for _ in range(8)} == {8.0}, "steps uncounted", log
            )
        finally:
            await asyncio.gather(*(client.close() for client, _ in held))

    with serving(folder, "--workers", "2", "--max-sessions", "8") as (url, proc):
        asyncio.run(scenario(url))
        assert stop(proc, signal.SIGINT) == 0


def test_an_app_that_would_ignore_the_session_timeout_is_refused(tmp_path: Path) -> None:
    # Reads the cap from the environment, but not the timeout.
    cap_only = (
        "ConcurrencyConfig(max_concurrent_envs=int(os.environ['OPENENV_MAX_CONCURRENT_ENVS']))"
    )
    folder = str(write_env(tmp_path / "env", config=cap_only))
    line = refused(folder, "--max-sessions", "1", "--session-timeout", "5")
    assert line.startswith("error: server/app.py ignores OPENENV_SESSION_TIMEOUT: asked for 5.0s")


def test_reload_serves_the_edited_app(tmp_path: Path) -> None:
    folder = write_env(tmp_path / "env")
    app_py = folder / "server" / "app.py"
    with serving(folder, "--reload") as (url, proc):
        assert health(url)["max_sessions"] == 8
        edited = app_py.read_text().replace("max_concurrent_envs=8", "max_concurrent_envs=9")
        app_py.write_text(edited)
        deadline = time.monotonic() + 30
        while health(url).get("max_sessions") != 9:
            assert time.monotonic() < deadline, (folder / "serve.log").read_text()
            time.sleep(0.1)
        assert stop(proc, signal.SIGINT) == 0


def health(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            answer: dict[str, Any] = json.load(response)
            return answer
    except OSError:  # between the old process and the new one
        return {}


@pytest.mark.parametrize(
    ("variable", "value", "unit"),
    [
        ("OPENENV_HEADER_TIMEOUT", "ten", "seconds"),
        ("OPENENV_HEADER_TIMEOUT", "0", "seconds"),
        ("OPENENV_MAX_HEADER_BYTES", "1.5", "bytes"),
    ],
)
def test_a_bad_header_limit_in_the_environment_is_refused_before_serving(
    tmp_path: Path, variable: str, value: str, unit: str
) -> None:
    folder = write_env(tmp_path / "env")
    ran = subprocess.run(
        [OPENENV, "serve", str(folder), "--port", "0"],
        env={**os.environ, variable: value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 1
    assert ran.stderr.strip().splitlines() == [
        f"error: {variable} must be a positive number of {unit}, not {value!r}"
    ]
    assert "serving" not in ran.stdout


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--ray", "--workers", "2"], "--workers"),
        (["--ray", "--reload"], "--reload"),
        (["--ray", "--session-timeout", "60"], "--session-timeout"),
        (["--replicas", "4"], "--replicas"),
        (["--max-replicas", "8"], "--max-replicas"),
        (["--num-cpus", "2"], "--num-cpus"),
        (["--start-timeout", "600"], "--start-timeout"),
    ],
)
def test_an_option_the_chosen_way_of_serving_would_drop_is_refused(
    tmp_path: Path, args: list[str], flag: str
) -> None:
    # `openenv serve --replicas 4` served one process, and `--ray --session-timeout`
    # a fleet whose sessions never timed out as asked: both without a word.
    folder = str(write_env(tmp_path / "env"))
    line = refused(folder, "--port", "0", *args)
    assert line.startswith(f"error: {flag} ")
    assert ("does not apply to --ray" if "--ray" in args else "is an option of --ray") in line
