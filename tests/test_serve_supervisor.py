"""``openenv serve --workers N``: one cap for the machine, and nothing left behind.

Every test starts the real ``openenv`` script in a session of its own, so its
workers (and multiprocessing's resource tracker) share its process group: the
group emptying is what "nothing left behind" means.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cli_envs import write_env
from dockerfiles import stop
from test_cli_serve import (
    OPENENV,
    Ping,
    eventually,
    health,
    how_it_ended,
    open_session,
    open_sessions,
    serving,
    spread,
    steps_ok,
)

from openenv import CapacityError, SessionClosedError, WebSocketEnvClient


def group(pgid: int) -> set[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        state, _, fields_pgid = stat.rsplit(")", 1)[1].split()[:3]
        if int(fields_pgid) == pgid and state != "Z":
            members.add(int(entry))
    return members


def wait_until_empty(pgid: int, log: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while left := group(pgid):
        if time.monotonic() > deadline:
            commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[-80:] for pid in left}
            raise AssertionError(f"left behind: {commands}\n{log.read_text()}")
        time.sleep(0.05)


@contextlib.contextmanager
def reaped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Whatever the test asserts, end what it left so that later tests have the cores:
    gracefully first, then anything still in its process group."""
    try:
        yield
    finally:
        stop(proc, signal.SIGINT)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(120)
def test_sigterm_as_the_first_worker_starts_stops_everything_and_exits_zero(
    tmp_path: Path,
) -> None:
    folder = write_env(tmp_path / "env")
    log = folder / "serve.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [OPENENV, "serve", str(folder), "--port", "0", "--workers", "2"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    with reaped(proc):
        deadline = time.monotonic() + 60
        while group(proc.pid) <= {proc.pid}:  # as soon as it has started a child
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
        wait_until_empty(proc.pid, log)


# Writes down where its workers count their slots (the supervisor's board).
RECORDS_BOARD = """\
from pathlib import Path


def record_board() -> None:
    (Path(__file__).parent / "board").write_text(os.environ.get("OPENENV_SLOT_BOARD", ""))
"""


PID_RECORDING_BOARD = (
    RECORDS_BOARD
    + """

def make() -> PidEnvironment:
    record_board()
    return PidEnvironment()
"""
)


def board_of(folder: Path) -> Path:
    board = Path((folder / "server" / "board").read_text())
    assert board.is_dir(), board  # one exists while it serves: what is gone below was there
    return board


@pytest.mark.timeout(120)
def test_workers_drain_and_stop_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    folder = write_env(tmp_path / "env", factory=PID_RECORDING_BOARD)
    log = folder / "serve.log"

    async def scenario(url: str, proc: subprocess.Popen[bytes]) -> list[str | int | None]:
        await eventually(lambda: health(url).get("workers") == 2, "a worker did not start", log)
        held = await open_sessions(url, 8)
        boards.append(board_of(folder))
        proc.kill()  # no handler runs: the workers must notice by themselves
        try:
            async with asyncio.timeout(60):
                return list(await asyncio.gather(*(how_it_ended(c) for c, _ in held)))
        except TimeoutError:
            message = f"sessions went on without a supervisor\n{log.read_text()}"
            raise AssertionError(message) from None

    boards: list[Path] = []
    with serving(folder, "--workers", "2") as (url, proc), reaped(proc):
        endings = asyncio.run(scenario(url, proc))
        wait_until_empty(proc.pid, log)
        address = urlsplit(url)
        with pytest.raises(ConnectionRefusedError):  # nobody holds the port any more
            socket.create_connection((address.hostname, address.port), timeout=5).close()
    assert set(endings) <= {"server shutting down", 1001}, endings
    assert not boards[0].exists(), "the last worker out left the supervisor's board behind"


# Forks a child that outlives its worker, as a multiprocessing pool does (fork
# is multiprocessing's default on Linux before Python 3.14).
FORKING = """\
import multiprocessing
import signal
import time


def sleep() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the server's handler it inherited
    time.sleep(600)


def make() -> PidEnvironment:
    # Daemonic: a worker that stops cleanly ends it; a killed one leaves it running,
    # holding what it inherited.
    child = multiprocessing.get_context("fork").Process(target=sleep, daemon=True)
    child.start()
    return PidEnvironment()
"""


# A step past the supervisor's deadline for apps it has not seen (10 s + 2 x 10 s),
# within this app's own shutdown_timeout.
LONG_STEP = """\
import time
from pathlib import Path


class Slow(PidEnvironment):
    def step(self, action: Ping, **kwargs: Any) -> Where:
        folder = Path(__file__).parent
        (folder / "stepping").touch()
        time.sleep(35)
        (folder / "stepped").touch()
        return super().step(action)


make = Slow
"""


@pytest.mark.timeout(180)
def test_workers_served_from_python_get_their_apps_own_shutdown_timeout(tmp_path: Path) -> None:
    # openenv.serve("server.app:app", workers=N) does not import the app itself:
    # its workers tell the supervisor the app's shutdown_timeout.
    config = "ConcurrencyConfig.from_env(max_concurrent_envs=8), shutdown_timeout=45"
    folder = write_env(tmp_path / "env", factory=LONG_STEP, config=config)
    log = folder / "serve.log"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    code = (
        "import sys, openenv; "
        "openenv.serve('server.app:app', fd=int(sys.argv[1]), workers=2, app_dir=sys.argv[2])"
    )
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(sock.fileno()), str(folder)],
            stdout=err,
            stderr=err,
            pass_fds=[sock.fileno()],
            start_new_session=True,
        )
    sock.close()

    async def scenario() -> None:
        await eventually(lambda: health(url).get("workers") == 2, "a worker did not start", log)
        client = WebSocketEnvClient(url)
        await client.reset()
        step = asyncio.ensure_future(client.step(Ping()))
        await eventually((folder / "server" / "stepping").exists, "no step under way", log)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 120) == 0, log.read_text()
        step.cancel()
        await asyncio.gather(step, return_exceptions=True)
        await client.close()

    with reaped(proc):
        asyncio.run(scenario())
        assert (folder / "server" / "stepped").exists(), log.read_text()  # not killed midway
        assert "killing it" not in log.read_text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "app",
    ["raise RuntimeError('cannot load the simulator')\n", "import sys\nsys.exit(1)\n"],
    ids=["raises", "exits 1"],
)
def test_workers_whose_app_fails_as_it_is_imported_stop_the_server(
    tmp_path: Path, app: str
) -> None:
    # scaling.md: a worker that fails during startup stops the server. From
    # Python nothing imports the app before the workers do, and such a worker
    # exits 1, not uvicorn's 3: it was replaced, and its replacement, for ever.
    folder = write_env(tmp_path / "env", app=app)
    log = folder / "serve.log"
    code = (
        "import sys, openenv; "
        "openenv.serve('server.app:app', port=0, workers=2, app_dir=sys.argv[1])"
    )
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(folder)],
            stdout=err,
            stderr=err,
            start_new_session=True,
        )
    with reaped(proc):
        try:
            returncode = proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still serving a broken app:\n{log.read_text()}") from None
        assert returncode == 3, log.read_text()
        assert "starting a replacement" not in log.read_text()
        wait_until_empty(proc.pid, log)


# Ends its worker with exit status 3, uvicorn's for an app that failed to start.
EXITS_3 = """\
class Exits(PidEnvironment):
    def step(self, action: Ping, **kwargs: Any) -> Where:
        if action.note == "exit 3":
            os._exit(3)
        return super().step(action)


make = Exits
"""


@pytest.mark.timeout(120)
def test_a_worker_that_exits_with_code_3_once_serving_is_replaced_not_the_server_stopped(
    tmp_path: Path,
) -> None:
    folder = write_env(tmp_path / "env", factory=EXITS_3)
    log = folder / "serve.log"

    async def scenario(url: str) -> None:
        await eventually(lambda: health(url).get("workers") == 2, "a worker did not start", log)
        held = await open_sessions(url, 4)
        try:
            await spread(url, held)
            (doomed, victim), others = held[0], [s for s in held if s[1] != held[0][1]]
            with pytest.raises(SessionClosedError):
                await doomed.step(Ping(note="exit 3"))
            await eventually(
                lambda: (
                    health(url).get("workers") == 2
                    and health(url).get("active_sessions") == len(others)
                ),
                "no replacement worker, or the server stopped",
                log,
            )
            assert await steps_ok(others)  # the other worker's sessions went on
            held = others + await open_sessions(url, len(held) - len(others))
            assert victim not in {pid for _, pid in held}
        finally:
            await asyncio.gather(*(client.close() for client, _ in held))

    with serving(folder, "--workers", "2", "--max-sessions", "4") as (url, proc), reaped(proc):
        asyncio.run(scenario(url))
        assert "exited with code 3; starting a replacement" in log.read_text()
        assert stop(proc, signal.SIGINT) == 0, log.read_text()


# A fork from C: no at-fork hook runs, so the child keeps the worker's row lock.
FORKING_FROM_C = """\
import ctypes
import time


def make() -> PidEnvironment:
    # The child: a helper that lives on (until the test kills the process group).
    if ctypes.CDLL(None).fork() == 0:
        time.sleep(600)
        os._exit(0)
    return PidEnvironment()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("factory", "cap"), [(FORKING, 4), (FORKING_FROM_C, 2)], ids=["python fork", "fork from C"]
)
def test_a_killed_workers_slots_are_freed_though_its_environment_forked(
    tmp_path: Path, factory: str, cap: int
) -> None:
    folder = write_env(tmp_path / "env", factory=factory)
    log = folder / "serve.log"

    async def scenario(url: str) -> None:
        await eventually(lambda: health(url).get("workers") == 2, "a worker did not start", log)
        held = await open_sessions(url, cap)
        try:
            victim = held[0][1]
            os.kill(victim, signal.SIGKILL)
            others = [(client, pid) for client, pid in held if pid != victim]
            await eventually(
                lambda: (
                    health(url).get("active_sessions") == len(others)
                    and health(url).get("workers") == 2
                ),
                "the dead worker's slots stayed taken (or it still counts as a worker)",
                log,
            )
            held = others + await open_sessions(url, len(held) - len(others))  # the whole cap
        finally:
            await asyncio.gather(*(client.close() for client, _ in held))

    with (
        serving(folder, "--workers", "2", "--max-sessions", str(cap)) as (url, proc),
        reaped(proc),
    ):
        asyncio.run(scenario(url))


@pytest.mark.timeout(120)
def test_a_refusal_counts_every_workers_sessions_and_churn_frees_the_whole_cap(
    tmp_path: Path,
) -> None:
    folder = write_env(tmp_path / "env")
    log = folder / "serve.log"

    async def scenario(url: str) -> None:
        await eventually(lambda: health(url).get("workers") == 2, "a worker did not start", log)
        held = await open_sessions(url, 8)
        try:
            await spread(url, held)
            extra = WebSocketEnvClient(url)
            with pytest.raises(CapacityError) as refused:
                await extra.reset()
            await extra.close()
            assert (refused.value.active_sessions, refused.value.max_sessions) == (8, 8)
        finally:
            await asyncio.gather(*(client.close() for client, _ in held))
        for _ in range(5):  # churn over both workers
            held = await open_sessions(url, 8)
            assert await open_session(url) is None
            await asyncio.gather(*(client.close() for client, _ in held))
        await eventually(lambda: health(url).get("active_sessions") == 0, "slots leaked", log)
        held = await open_sessions(url, 8)  # the whole cap, again
        await asyncio.gather(*(client.close() for client, _ in held))

    with serving(folder, "--workers", "2", "--max-sessions", "8") as (url, proc), reaped(proc):
        asyncio.run(scenario(url))


# An ``async def`` step that blocks the event loop for good: only a thread
# can still see the shutdown's deadline pass.
BLOCKING = (
    RECORDS_BOARD
    + """\
import time
from pathlib import Path


class Stuck(PidEnvironment):
    async def step(self, action: Ping, **kwargs: Any) -> Where:
        (Path(__file__).parent / f"stepping-{os.getpid()}").touch()
        while True:
            time.sleep(3600)


def make() -> Stuck:
    record_board()
    return Stuck()
"""
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_ends_a_server_whose_event_loop_is_blocked(tmp_path: Path, workers: str) -> None:
    config = "ConcurrencyConfig.from_env(max_concurrent_envs=8), shutdown_timeout=1"
    folder = write_env(tmp_path / "env", factory=BLOCKING, config=config)
    log = folder / "serve.log"

    async def scenario(url: str, proc: subprocess.Popen[bytes]) -> None:
        await eventually(lambda: health(url).get("workers") == int(workers), "no workers", log)
        (client, pid), *_ = await open_sessions(url, 1)
        stepping = asyncio.ensure_future(client.step(Ping()))
        await eventually((folder / "server" / f"stepping-{pid}").exists, "no step", log)
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 60)  # shutdown_timeout is 1 s: "at all"
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM did not end it\n{log.read_text()}") from None
        await asyncio.gather(stepping, return_exceptions=True)
        await client.close()

    with serving(folder, "--workers", workers) as (url, proc), reaped(proc):
        asyncio.run(scenario(url, proc))
        wait_until_empty(proc.pid, log)
    assert "the shutdown overran its 11s deadline" in log.read_text()


# C code that never returns and holds the GIL (a regular expression
# backtracking for ever, say): neither a signal handler nor any other thread
# of the worker runs again. Sleeping in C through PyDLL (which keeps the GIL)
# is that, without burning a core.
HOLDING_THE_GIL = """\
import ctypes
from pathlib import Path


class Holding(PidEnvironment):
    async def step(self, action: Ping, **kwargs: Any) -> Where:
        (Path(__file__).parent / f"stepping-{os.getpid()}").touch()
        while True:  # a signal may cut one sleep short
            ctypes.PyDLL(None).sleep(3600)


def make() -> Holding:
    return Holding()
"""


@pytest.mark.timeout(180)
def test_the_supervisor_kills_workers_that_cannot_even_take_their_signal(tmp_path: Path) -> None:
    config = "ConcurrencyConfig.from_env(max_concurrent_envs=8), shutdown_timeout=1"
    folder = write_env(tmp_path / "env", factory=HOLDING_THE_GIL, config=config)
    log = folder / "serve.log"

    async def scenario(url: str, proc: subprocess.Popen[bytes]) -> None:
        await eventually(lambda: health(url).get("workers") == 2, "no workers", log)
        held = await open_sessions(url, 2)
        await spread(url, held)
        steps = [asyncio.ensure_future(client.step(Ping())) for client, _ in held]
        for _, pid in held:  # both workers stuck: nothing else ends to wake the supervisor
            await eventually((folder / "server" / f"stepping-{pid}").exists, "no step", log)
        proc.send_signal(signal.SIGTERM)
        try:
            assert await asyncio.to_thread(proc.wait, 90) == 0
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM did not end it\n{log.read_text()}") from None
        await asyncio.gather(*steps, return_exceptions=True)
        await asyncio.gather(*(client.close() for client, _ in held))

    with serving(folder, "--workers", "2") as (url, proc), reaped(proc):
        asyncio.run(scenario(url, proc))
        wait_until_empty(proc.pid, log)
    assert log.read_text().count("did not stop within 21s of the signal") == 2


@pytest.mark.timeout(180)
def test_an_orphaned_worker_whose_event_loop_is_blocked_still_ends(tmp_path: Path) -> None:
    config = "ConcurrencyConfig.from_env(max_concurrent_envs=8), shutdown_timeout=1"
    folder = write_env(tmp_path / "env", factory=BLOCKING, config=config)
    log = folder / "serve.log"

    async def scenario(url: str, proc: subprocess.Popen[bytes]) -> None:
        await eventually(lambda: health(url).get("workers") == 2, "no workers", log)
        (client, pid), *_ = await open_sessions(url, 1)
        stepping = asyncio.ensure_future(client.step(Ping()))
        await eventually((folder / "server" / f"stepping-{pid}").exists, "no step", log)
        boards.append(board_of(folder))
        proc.kill()
        await asyncio.to_thread(wait_until_empty, proc.pid, log, 90)
        await asyncio.gather(stepping, return_exceptions=True)
        await client.close()

    boards: list[Path] = []
    with serving(folder, "--workers", "2") as (url, proc), reaped(proc):
        asyncio.run(scenario(url, proc))
    assert "the shutdown overran its 11s deadline" in log.read_text()
    # The stuck worker was the last out, by its deadline's thread: it removed the board.
    assert not boards[0].exists(), "the stuck worker left the supervisor's board behind"


SERVING = re.compile(r"at (http://\S+) \(")

# Two environments of one class (so of one name) behind one server.
TWINS = """\
import os
from typing import Any

from openenv import Action, ConcurrencyConfig, Environment, EnvSpec, Observation, State
from openenv import create_multi_app


class Ping(Action):
    note: str = ""


class Where(Observation):
    pid: int


class Twin(Environment[Ping, Where, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: Any = None, episode_id: Any = None, **kwargs: Any) -> Where:
        return Where(pid=os.getpid())

    def step(self, action: Ping, **kwargs: Any) -> Where:
        return Where(pid=os.getpid(), reward=1.0)

    @property
    def state(self) -> State:
        return State()


two = ConcurrencyConfig(max_concurrent_envs=2)
app = create_multi_app({name: EnvSpec(Twin, Ping, Where, two) for name in ("easy", "hard")})
"""


@pytest.mark.timeout(120)
def test_each_environment_of_a_multi_app_keeps_its_own_cap_across_workers(
    tmp_path: Path,
) -> None:
    folder = write_env(tmp_path / "env", app=TWINS)
    log, out = folder / "serve.log", folder / "serve.out"
    with log.open("wb") as err, out.open("wb") as stdout:
        proc = subprocess.Popen(
            [OPENENV, "serve", str(folder), "--port", "0", "--workers", "2"],
            stdout=stdout,
            stderr=err,
            start_new_session=True,
        )

    async def scenario() -> None:
        await eventually(lambda: SERVING.search(out.read_text()) is not None, "no url", log)
        url = SERVING.search(out.read_text()).group(1)  # type: ignore[union-attr]
        easy, hard = f"{url}/envs/easy", f"{url}/envs/hard"
        await eventually(lambda: health(easy).get("workers") == 2, "no workers", log)
        held = await open_sessions(easy, 2)
        try:
            assert await open_session(easy) is None  # easy is full
            assert (health(easy)["active_sessions"], health(hard)["active_sessions"]) == (2, 0)
            held += await open_sessions(hard, 2)  # hard is not
            assert health(easy)["workers"] == 2
        finally:
            await asyncio.gather(*(client.close() for client, _ in held))

    with reaped(proc):
        asyncio.run(scenario())
