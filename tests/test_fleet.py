"""A fleet on a real two-node Ray cluster: placement, one address, restarts, Runners.

Scaling is in ``test_fleet_scaling.py``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fleet_kit import COUNTER, ECHO, healthy, replicas, until

from echo_env.models import EchoAction
from openenv import (
    AuthenticationError,
    CapacityError,
    ConnectionFailedError,
    RemoteEnv,
    RequestFailedError,
    RunConfig,
    Runners,
    ServerPool,
    Task,
    WebSocketEnvClient,
)
from openenv.cli.app_loader import AppLoadError
from openenv.fleet import Fleet
from openenv.runtime import EpisodeSession

OPENENV = str(Path(sys.executable).with_name("openenv"))


def test_replicas_spread_over_both_nodes_behind_one_address(two_nodes: list[str]) -> None:
    assert len(two_nodes) == 2
    fleet = Fleet(ECHO, replicas=4, num_cpus=0.5, max_sessions=8)
    with fleet as url:
        until(lambda: len(healthy(url)) == 4, "4 healthy replicas")
        assert {p["node"] for p in fleet.where()} == set(two_nodes)  # spread over both
        fleet_health = httpx.get(f"{url}/health").json()
        assert (fleet_health["max_sessions"], fleet_health["replicas"]) == (32, 4)

        async def fill() -> dict[str, int]:
            pool = ServerPool(url)
            clients = [WebSocketEnvClient(pool) for _ in range(32)]  # the fleet's whole room
            await asyncio.gather(*(c.reset() for c in clients))
            placed = {c.url: 0 for c in clients}
            for c in clients:
                placed[c.url] += 1
            await asyncio.gather(*(c.close() for c in clients))
            return placed

        placed = asyncio.run(fill())
        assert sorted(placed.values()) == [8, 8, 8, 8]  # every replica full, none refused


def test_a_killed_replica_is_restarted_and_listed_again(two_nodes: list[str]) -> None:
    fleet = Fleet(ECHO, replicas=2, num_cpus=0.5, max_sessions=4, interval=0.5)
    with fleet as url:
        until(lambda: len(healthy(url)) == 2, "2 healthy replicas")
        places = fleet.where()
        assert {p["node"] for p in places} == set(two_nodes)  # SPREAD: one per node
        victim = places[0]
        os.kill(victim["pid"], signal.SIGKILL)
        until(
            lambda: (
                len(healthy(url)) == 2 and victim["pid"] not in {r["pid"] for r in healthy(url)}
            ),
            "the killed replica back, in a new process",
        )


async def chatty(session: EpisodeSession) -> int:
    """Enough steps, spaced out, that a run is still going when a replica dies."""
    await session.reset()
    for n in range(5):
        await session.step(EchoAction(message=f"{session.task.id}/{n}"))
        await asyncio.sleep(0.01)
    return 5


class KillsItsReplica:
    """Plays like ``chatty``; in the victim task's first attempt it SIGKILLs its own replica.

    The kill comes from inside an episode, so the replica surely dies with
    sessions on it (a killer reading the fleet's half-second-old load can hit
    a replica that has just gone idle). The marker file, created exclusively,
    makes it happen once across every Ray worker and attempt, and records the pid.
    """

    def __init__(self, fleet_url: str, marker: Path, victim: str) -> None:
        self.fleet_url, self.marker, self.victim = fleet_url, marker, victim

    async def __call__(self, session: EpisodeSession) -> int:
        await session.reset()
        for n in range(5):
            if n == 2 and session.task.id == self.victim and self._first():
                where = urlsplit(session.client.url).netloc
                up = await asyncio.to_thread(healthy, self.fleet_url)
                pid = next(r["pid"] for r in up if urlsplit(r["url"]).netloc == where)
                self.marker.write_text(str(pid))
                os.kill(pid, signal.SIGKILL)
            await session.step(EchoAction(message=f"{session.task.id}/{n}"))
            await asyncio.sleep(0.01)
        return 5

    def _first(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def test_runners_on_ray_lose_nothing_when_a_replica_dies_mid_run(
    two_nodes: list[str], tmp_path: Path
) -> None:
    fleet = Fleet(ECHO, replicas=4, num_cpus=0.25, max_sessions=16, interval=0.5)
    with fleet as url:
        until(lambda: len(healthy(url)) == 4, "4 healthy replicas")
        pool = ServerPool(url)
        marker = tmp_path / "killed"
        agent = KillsItsReplica(url, marker, victim="t0300")
        tasks = [Task(id=f"t{i:04}", env=pool, agent=agent) for i in range(1000)]
        config = RunConfig(engine_name="ray", worker_num=2, max_concurrency=16, retries=3)
        results = Runners.sync_run_task(tasks, config)
        killed = int(marker.read_text())
        assert [r.task_id for r in results] == [t.id for t in tasks]  # one result each
        assert [r.status.value for r in results] == ["ok"] * 1000, {
            r.error.describe() for r in results if r.error
        }
        assert results[300].attempts > 1  # died with its replica, played again elsewhere
        until(
            lambda: len(healthy(url)) == 4 and killed not in {r["pid"] for r in healthy(url)},
            "the replica back, in a new process",
        )


def test_a_plain_client_given_the_fleet_address_is_sent_to_a_replica(
    two_nodes: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    uvicorn_errors = logging.getLogger("uvicorn.error")  # uvicorn's own: it does not propagate
    with Fleet(ECHO, replicas=2, num_cpus=0.5, max_sessions=2, interval=0.3) as url:
        uvicorn_errors.addHandler(caplog.handler)  # after uvicorn has set its logging up
        until(lambda: len(healthy(url)) == 2, "2 healthy replicas")

        async def play() -> None:
            clients = [WebSocketEnvClient(url) for _ in range(4)]  # a plain URL, no pool
            try:
                replies = await asyncio.gather(*(c.step(EchoAction(message="hi")) for c in clients))
                extra = [r.observation.model_extra or {} for r in replies]
                assert [e["echoed_message"] for e in extra] == ["hi"] * 4
                # The directory spread the burst by room: both replicas full.
                await asyncio.to_thread(until, lambda: both_full(url), "2 sessions on each")
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        try:
            asyncio.run(play())
        finally:
            uvicorn_errors.removeHandler(caplog.handler)
    # A redirect is how the directory answers, not an unfinished handshake.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_the_directory_answers_the_environments_other_routes_from_a_replica(
    two_nodes: list[str],
) -> None:
    key = "the-fleets-key"
    environ = {"OPENENV_API_KEY": key}
    with Fleet(COUNTER, replicas=1, num_cpus=0.5, interval=0.3, environ=environ) as url:
        until(lambda: len(healthy(url)) == 1, "a healthy replica")
        replica = healthy(url)[0]["url"]

        async def read(base: str, api_key: str | None = key) -> tuple[Any, ...]:
            env = RemoteEnv(base, api_key=api_key)
            tasks = await env.list_tasks("train", offset=5, limit=3)
            return await env.list_splits(), tasks, await env.list_tools()

        # Through the directory, the API key and the query string go along.
        assert asyncio.run(read(url)) == asyncio.run(read(replica))
        with pytest.raises(RequestFailedError, match="401"):  # the replica checks the key
            asyncio.run(read(url, api_key=None))
        assert httpx.get(f"{url}/metrics").status_code == 404  # one replica's are not the fleet's
        # The web page is sent to a replica whole, since it plays over its own /web/ws.
        page = httpx.get(f"{url}/web?api_key={key}")
        assert (page.status_code, page.headers["location"]) == (307, f"{replica}/web?api_key={key}")
        page = httpx.get(f"{url}/web/?api_key={key}")  # as a server's own /web/ redirects
        assert (page.status_code, page.headers.get("location")) == (
            307,
            f"{replica}/web?api_key={key}",
        )
        # DNS rebinding (security.md): the directory asks replicas by address, so
        # it must refuse a rebound name itself, as a replica would.
        rebound = {"Host": "evil.example", "Authorization": f"Bearer {key}"}
        for path in ("/schema", "/tasks?split=train", "/replicas", "/health"):
            refused = httpx.get(f"{url}{path}", headers=rebound)
            assert refused.status_code == 403, (path, refused.text)
            assert "host 'evil.example' is not allowed" in refused.json()["detail"]


async def say_hi(session: EpisodeSession) -> str:
    await session.reset()
    reply = await session.step(EchoAction(message="hi"))
    return str((reply.observation.model_extra or {})["echoed_message"])


def test_a_keyed_fleets_one_address_takes_plain_clients_and_runners(
    two_nodes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The directory redirects /ws to a replica, on another host and port, which
    # checks the key: websockets drops Authorization on such a redirect.
    key = "the-fleets-key"
    environ = {"OPENENV_API_KEY": key}
    with Fleet(ECHO, replicas=1, num_cpus=0.5, interval=0.3, environ=environ) as url:
        until(lambda: len(healthy(url)) == 1, "a healthy replica")

        async def step(api_key: str | None) -> str:
            async with WebSocketEnvClient(url, api_key=api_key) as env:
                reply = await env.step(EchoAction(message="hi"))
                return str((reply.observation.model_extra or {})["echoed_message"])

        assert asyncio.run(step(key)) == "hi"
        with pytest.raises(AuthenticationError):  # the replica still checks it
            asyncio.run(step(None))
        # Runners' sessions share protocol v2 connections; the key from the environment.
        monkeypatch.setenv("OPENENV_API_KEY", key)
        tasks = [Task(id=f"t{i}", env=url, agent=say_hi) for i in range(4)]
        results = Runners.sync_run_task(tasks, RunConfig(worker_num=1))
        assert [(r.status.value, r.value) for r in results] == [("ok", "hi")] * 4, results


def test_the_directorys_ws_redirect_keeps_the_query_and_a_key_in_it(two_nodes: list[str]) -> None:
    key = "the-fleets-key"
    environ = {"OPENENV_API_KEY": key}
    with Fleet(ECHO, replicas=1, num_cpus=0.5, interval=0.3, environ=environ) as url:
        until(lambda: len(healthy(url)) == 1, "a healthy replica")

        async def step() -> str:
            async with WebSocketEnvClient(f"{url}/ws?api_key={key}") as env:
                reply = await env.step(EchoAction(message="hi"))
                return str((reply.observation.model_extra or {})["echoed_message"])

        assert asyncio.run(step()) == "hi"


def both_full(url: str) -> bool:
    return sorted(r["active_sessions"] for r in healthy(url)) == [2, 2]


BLOCKING_APP = """
import time

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, create_app


class BlocksWhenAsked(EchoEnvironment):
    async def step(self, action, **kwargs):
        if action.message == "block":
            time.sleep(1.5)  # blocks the replica's loop: its /health says "degraded"
        return EchoEnvironment.step(self, action)


concurrency = ConcurrencyConfig(max_concurrent_envs=4)
app = create_app(BlocksWhenAsked, EchoAction, EchoObservation, concurrency)
"""


def test_a_degraded_replica_still_serves_through_the_fleets_address(
    two_nodes: list[str], tmp_path: Path
) -> None:
    folder = tmp_path / "blocking_env"
    shutil.copytree(ECHO, folder, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    (folder / "server" / "app.py").write_text(BLOCKING_APP)
    with Fleet(folder, replicas=1, num_cpus=0.5, interval=0.3) as url:
        until(lambda: len(healthy(url)) == 1, "a healthy replica")

        async def step(message: str) -> str:
            async with WebSocketEnvClient(url) as env:  # a plain client: the /ws redirect
                reply = await env.step(EchoAction(message=message))
                return str((reply.observation.model_extra or {})["echoed_message"])

        assert asyncio.run(step("block")) == "block"

        def degraded() -> bool:
            return [r["status"] for r in replicas(url)] == ["degraded"]

        until(degraded, "the replica's /health saying degraded")
        # Slowed, not down: sessions still go there, and the address says so.
        assert asyncio.run(step("again")) == "again"
        assert httpx.get(f"{url}/health").json()["status"] == "degraded"
        assert httpx.get(f"{url}/schema").status_code == 200


def test_a_fleet_whose_app_cannot_load_refuses_to_start(
    two_nodes: list[str], tmp_path: Path
) -> None:
    import ray

    broken = tmp_path / "broken_env"
    shutil.copytree(ECHO, broken, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    with (broken / "server" / "app.py").open("a") as app:
        app.write("raise RuntimeError('a typo in the environment')\n")
    said = r"importing server/app\.py:\d+ failed: RuntimeError: a typo in the environment"
    # Not a fleet whose replicas Ray restarts for ever: the error, as `openenv serve` gives it.
    with pytest.raises(AppLoadError, match=said):
        Fleet(broken, replicas=1, num_cpus=0.5).start()
    done = subprocess.run(
        [OPENENV, "serve", str(broken), "--ray", "--port", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address},
        timeout=300,
        check=False,
    )
    assert done.returncode == 1
    assert re.search(f"^error: {said}$", done.stderr, re.MULTILINE), done.stderr


@contextlib.contextmanager
def openenv_serve_ray(folder: Path, out: Path, *flags: str) -> Iterator[str]:
    """``openenv serve FOLDER --ray FLAGS`` on the test's cluster, its output in
    ``out``; the fleet's address once its banner is out. Interrupted (SIGINT) at
    the end, it must exit 0."""
    import ray

    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [OPENENV, "serve", str(folder), "--ray", "--port", "0", *flags],
            stdout=stdout,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address},
            start_new_session=True,
        )
    try:
        until(lambda: "clients: ServerPool(" in out.read_text(), "the banner", 120)
        yield re.search(r"ServerPool\('(\S+)'\)", out.read_text()).group(1)  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_openenv_serve_ray_runs_a_fleet_until_interrupted(
    two_nodes: list[str], tmp_path: Path
) -> None:
    flags = ("--replicas", "2", "--num-cpus", "0.25", "--max-sessions", "4")
    with openenv_serve_ray(ECHO, tmp_path / "serve.out", *flags) as url:
        until(lambda: len(healthy(url)) == 2, "2 healthy replicas")


def test_ctrl_c_while_the_fleet_starts_stops_it_at_once(
    two_nodes: list[str], tmp_path: Path
) -> None:
    import ray

    # An app whose import never ends: the check on the cluster waits for it
    # (two minutes), and Ctrl+C used to wait as long, and then for the replicas.
    folder = tmp_path / "hanging_env"
    shutil.copytree(ECHO, folder, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    importing = tmp_path / "importing"
    hang = f"import time\nopen({str(importing)!r}, 'w').close()\ntime.sleep(3600)\n"
    (folder / "server" / "app.py").write_text(hang)
    out = tmp_path / "serve.out"
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [OPENENV, "serve", str(folder), "--ray", "--port", "0"],
            stdout=stdout,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address},
            start_new_session=True,
        )
    try:
        until(importing.exists, "the app being imported on the cluster", 120)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, out.read_text()  # not the two minutes of the check
        assert "interrupted while the fleet was starting" in out.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def echo_with_app(tmp_path: Path, app: str) -> tuple[Path, Path, dict[str, str]]:
    """A copy of echo_env serving ``app`` (which reads ``$OPENENV_TEST_MARKER``),
    the marker file's path (not made) and the replicas' environment."""
    folder = tmp_path / "env"
    shutil.copytree(ECHO, folder, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    (folder / "server" / "app.py").write_text(app)
    marker = tmp_path / "marker"
    return folder, marker, {"OPENENV_TEST_MARKER": str(marker)}


FAILS_ON_RESTART_APP = """
import os

from echo_env.server.app import app

marker = os.environ["OPENENV_TEST_MARKER"]
if os.path.exists(marker):
    open(marker + ".failed", "w").close()
    raise RuntimeError("a dependency is gone for now")
"""


def test_a_replica_that_cannot_restart_is_replaced_and_scaling_goes_on(
    two_nodes: list[str], tmp_path: Path
) -> None:
    # A replica killed while its app cannot load (a dependency away for a
    # moment) fails its restart: Ray gives up on that actor for good. The fleet
    # replaces it once the app loads again, rather than keep a dead replica
    # that it counts as one on its way (which would block scaling up for ever).
    folder, marker, environ = echo_with_app(tmp_path, FAILS_ON_RESTART_APP)
    fleet = Fleet(folder, replicas=1, num_cpus=0.25, max_sessions=2, interval=0.2, environ=environ)
    with fleet as url:
        until(lambda: len(healthy(url)) == 1, "a healthy replica")
        victim = healthy(url)[0]["pid"]
        marker.touch()
        os.kill(victim, signal.SIGKILL)
        until(Path(f"{marker}.failed").exists, "the replica's restart failing")
        with pytest.raises(ConnectionFailedError, match="HTTP 503: no replica of this fleet is up"):
            asyncio.run(WebSocketEnvClient(url).reset())  # said at once, not waited out
        marker.unlink()
        until(lambda: len(healthy(url)) == 1, "a replica serving again")
        assert victim not in {r["pid"] for r in healthy(url)}
        assert len(fleet.where()) == 1  # replaced, not one more beside a dead one

        async def one_too_many() -> None:
            # Full (its two slots taken) is not down: a plain client is told as a
            # full server tells it, CapacityError, which callers retry later.
            held = [WebSocketEnvClient(url) for _ in range(2)]
            try:
                await asyncio.gather(*(c.reset() for c in held))
                await asyncio.to_thread(
                    until, lambda: healthy(url)[0]["active_sessions"] == 2, "both slots seen"
                )
                with pytest.raises(CapacityError, match="every replica of this fleet is full") as e:
                    await WebSocketEnvClient(url).reset()
                assert (e.value.active_sessions, e.value.max_sessions) == (2, 2)
            finally:
                await asyncio.gather(*(c.close() for c in held))

        asyncio.run(one_too_many())


# Long enough for a replica's start on a loaded 2-core machine (a healthy start
# past it is replaced too, the next given twice as long), short enough for a
# test to wait it out.
START_TIMEOUT = 10


def one_replica_with_app(tmp_path: Path, app: str) -> tuple[Fleet, Path]:
    """A fleet of one replica of ``echo_with_app``, given up after START_TIMEOUT."""
    folder, marker, environ = echo_with_app(tmp_path, app)
    fleet = Fleet(
        folder,
        replicas=1,
        num_cpus=0.25,
        interval=0.2,
        start_timeout=START_TIMEOUT,
        environ=environ,
    )
    return fleet, marker


HANGS_ON_RESTART_APP = """
import os
import time

from echo_env.server.app import app

marker = os.environ["OPENENV_TEST_MARKER"]
if os.path.exists(marker):
    open(f"{marker}.{os.getpid()}", "w").close()
    time.sleep(3600)  # as stuck as a start that waits on something that never comes
"""


def test_a_replica_whose_start_hangs_is_replaced_after_its_start_timeout(
    two_nodes: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Ray restarts a killed replica, and this restart hangs in the app's import:
    # counted as room on its way for ever, it would keep the fleet from ever
    # serving again or growing. Past start_timeout it is given up and replaced.
    fleet, marker = one_replica_with_app(tmp_path, HANGS_ON_RESTART_APP)
    with caplog.at_level(logging.WARNING, logger="openenv"), fleet as url:
        until(lambda: len(healthy(url)) == 1, "a healthy replica")
        victim = healthy(url)[0]["pid"]
        marker.touch()
        os.kill(victim, signal.SIGKILL)
        until(lambda: any(tmp_path.glob("marker.*")), "the replica's restart hanging")
        marker.unlink()  # the next start goes through
        until(lambda: len(healthy(url)) == 1, "a replica serving again")
        assert victim not in {r["pid"] for r in healthy(url)}
        assert len(fleet.where()) == 1  # replaced, not one more beside a hung one
        assert f"not up within its start_timeout, {START_TIMEOUT}s" in caplog.text
        with WebSocketEnvClient(url) as env:  # and a session through the fleet's address
            assert env.reset().observation.echoed_message == ""


SLOW_START_APP = """
import time

from echo_env.server.app import app

time.sleep(5)  # every start loads something slow: a model, a dataset...
"""


def test_replicas_slower_to_start_than_start_timeout_come_up_with_more_time(
    two_nodes: list[str], tmp_path: Path
) -> None:
    # Every start takes longer than start_timeout. Given the same time again
    # and again, each replica was given up before it served, for ever; each
    # start given up doubles the next one's time, so one comes up. Through
    # `openenv serve --ray --start-timeout`, as a user with a slow app sets it.
    # Given 4, 8, 16, then 32 s (the most), a start may take up to 32 s on a
    # loaded machine: until() waits for all of them.
    folder, _, _ = echo_with_app(tmp_path, SLOW_START_APP)
    out = tmp_path / "serve.out"
    with openenv_serve_ray(folder, out, "--start-timeout", "4", "--num-cpus", "0.25") as url:
        until(lambda: len(healthy(url)) == 1, "a replica serving", seconds=120)
        said = out.read_text()
        assert "not up within its start_timeout, 4s; the next start is given 8s" in said, said
        # Each given up was replaced, none added beside it.
        assert len(replicas(url)) == 1
        with WebSocketEnvClient(url) as env:
            assert env.reset().observation.echoed_message == ""


FREEZES_ON_REQUEST_APP = """
import os
import time

from echo_env.server.app import app


@app.post("/freeze")
async def freeze() -> None:
    open(f"{os.environ['OPENENV_TEST_MARKER']}.{os.getpid()}", "w").close()
    time.sleep(3600)  # blocks the server's event loop for good; the actor still answers Ray
"""


def test_a_replica_that_stops_serving_is_replaced_after_its_start_timeout(
    two_nodes: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A replica whose server no longer answers (its event loop blocked by a
    # misbehaving route or environment) while its actor is alive would count as
    # room on its way for ever: the fleet would neither serve nor grow again.
    fleet, marker = one_replica_with_app(tmp_path, FREEZES_ON_REQUEST_APP)
    with caplog.at_level(logging.WARNING, logger="openenv"), fleet as url:
        until(lambda: len(healthy(url)) == 1, "a healthy replica")
        frozen = healthy(url)[0]
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{frozen['url']}/freeze", timeout=1)
        assert Path(f"{marker}.{frozen['pid']}").exists()  # its loop is stuck in the route
        until(lambda: frozen["pid"] not in {r["pid"] for r in healthy(url)}, "a replacement")
        until(lambda: len(healthy(url)) == 1, "a replica serving again")
        assert len(fleet.where()) == 1  # replaced, not one more beside the frozen one
        assert f"not serving for its start_timeout, {START_TIMEOUT}s" in caplog.text
        with WebSocketEnvClient(url) as env:
            assert env.reset().observation.echoed_message == ""


def test_a_fleet_that_fails_to_start_leaves_no_replica_behind(two_nodes: list[str]) -> None:
    import ray

    def free_slots() -> float:
        return float(ray.available_resources().get("head_slot", 0))  # type: ignore[no-untyped-call]

    with socket.socket() as taken:  # the directory's port is in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fleet = Fleet(ECHO, replicas=2, num_cpus=0.25, resources={"head_slot": 1}, port=port)
        with pytest.raises(OSError, match="in use"):
            fleet.start()
    # Its replicas had started: they are gone with the failed start, not left holding their room.
    until(lambda: free_slots() == 100, "the replicas' resources released", 30)
