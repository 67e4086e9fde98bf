"""OpenEnv's stateless HTTP calls (``POST /reset``, ``POST /step``, ``GET /state``).

OpenEnv's template documents them in its ``server/app.py``; each runs on a
fresh environment. The same requests go to OpenEnv 0.10's own server (in its
venv, serving ``tests/apps/oe_echo`` as its template wrote it) and to ours
serving the same folder: the same statuses and the same bodies. Here each is
also a session like any other: it counts against the cap and leaves nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from peer_venvs import APPS
from peer_venvs import peer_python as peer_venv
from servers import slots_free

from openenv import WebSocketEnvClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from openenv.testing import run_server

sys.path.insert(0, str(APPS))

from oe_echo.server.app import app as oe_echo_app

pytestmark = pytest.mark.timeout(300)

# (method, path, JSON body) — a reset, a seeded one, steps good and bad, the state.
CALLS: list[tuple[str, str, Any]] = [
    ("POST", "/reset", None),
    ("POST", "/reset", {"seed": 3, "episode_id": "ep-1"}),
    ("POST", "/step", {"action": {"message": "Hello!"}}),
    ("POST", "/step", {"action": {"message": "Hello!", "metadata": {"k": 1}}}),
    ("POST", "/step", {"action": {"message": 5}}),
    ("POST", "/step", {"action": {"nope": "x"}}),
    ("POST", "/step", {}),
    ("GET", "/state", None),
]


@pytest.fixture(scope="module")
def openenv_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """OpenEnv 0.10's own server for the template, in OpenEnv's venv."""
    python = peer_venv(
        tmp_path_factory, APPS / "openenv_peer_requirements.txt", ".venv-openenv-peer"
    )
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    # The peer's Python must not see this checkout's `openenv` on its path.
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [str(python), "-m", "uvicorn", "server.app:app", "--fd", str(listener.fileno())]
    server = subprocess.Popen(
        command,
        cwd=APPS / "oe_echo",
        env=environ,
        pass_fds=[listener.fileno()],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    listener.close()
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "OpenEnv's server up within 120 s"
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(30)
        server.stderr.close()  # type: ignore[union-attr]


def call(url: str, method: str, path: str, body: Any) -> tuple[int, Any]:
    answer = httpx.request(method, url + path, json=body)
    return answer.status_code, answer.json()


def comparable(status: int, body: Any) -> Any:
    """What must match: a 200's body (its random episode id aside), or, for a
    422, where each problem is and what kind."""
    if status == 422:
        detail = body["detail"]
        if isinstance(detail, str):  # a body with no action: FastAPI's list at OpenEnv
            return "no action"
        return sorted((e["loc"][-1], e["type"]) for e in detail if e["loc"][0] != "body")
    if isinstance(body, dict) and "episode_id" in body and body.get("episode_id") != "ep-1":
        return {**body, "episode_id": "<random>"}
    return body


def test_openenvs_http_calls_answer_as_openenvs_own_server_does(openenv_server: str) -> None:
    with run_server(oe_echo_app) as ours:
        for method, path, body in CALLS:
            theirs_status, theirs = call(openenv_server, method, path, body)
            our_status, our_body = call(ours, method, path, body)
            assert our_status == theirs_status, (method, path, body, our_body, theirs)
            if path == "/step" and body == {}:
                continue  # FastAPI's own 422 list there; ours says what is missing
            assert comparable(our_status, our_body) == comparable(theirs_status, theirs), (
                method,
                path,
                body,
            )


def test_each_http_call_takes_a_slot_of_the_cap_and_frees_it() -> None:
    app = create_app(_Counter, _Bump, _Count, env_name="counter", max_concurrent_envs=1)
    with run_server(app) as url:
        for _ in range(3):  # nothing carries from one call to the next
            assert call(url, "POST", "/step", {"action": {}}) == (
                200,
                {
                    "observation": {"metadata": {}, "count": 1},
                    "reward": None,
                    "done": False,
                    "metadata": None,
                },
            )
        assert httpx.get(f"{url}/health").json()["active_sessions"] == 0
        holder = WebSocketEnvClient(url, action_cls=_Bump, observation_cls=_Count)
        try:
            holder.reset()  # the one slot, held over /ws
            full = httpx.post(f"{url}/reset", json={})
            assert full.status_code == 503
            assert full.headers["retry-after"] == "1"
            assert "capacity" in full.json()["detail"]
        finally:
            holder.close()
        assert call(url, "POST", "/reset", {})[0] == 200  # the slot back


async def test_an_environment_that_raises_is_a_500_that_names_no_internals() -> None:
    app = create_app(_Raises, _Bump, _Count, env_name="raises", max_concurrent_envs=4)
    with run_server(app) as url:
        async with httpx.AsyncClient() as http:
            answer = await http.post(f"{url}/reset", json={})
            assert answer.status_code == 500
            assert "secret" not in answer.text  # the exception's text stays on the server
            assert "reset() raised KeyError" in answer.json()["detail"]
        await slots_free(url)


def test_metadata_is_what_an_openenv_environments_get_metadata_says() -> None:
    # OpenEnv's server answers /metadata with get_metadata() of a fresh
    # environment; one that overrides it (a version, an author) says so here too.
    _Described.made = 0
    app = create_app(_Described, _Bump, _Count, env_name="described", max_concurrent_envs=1)
    with run_server(app) as url:
        for _ in range(3):
            said = httpx.get(f"{url}/metadata").json()
            assert (said["name"], said["version"], said["author"]) == ("Described", "2.1", "me")
            assert said["description"] == "says what it is"
        assert _Described.made == 1  # asked once, then kept
        assert httpx.get(f"{url}/health").json()["active_sessions"] == 0
    plain = create_app(_Counter, _Bump, _Count, env_name="counter", max_concurrent_envs=1)
    with run_server(plain) as url:  # no override: create_app's name, as before
        assert httpx.get(f"{url}/metadata").json()["name"] == "counter"


@pytest.mark.parametrize("raised", ["KeyError", "SystemExit"])
def test_a_get_metadata_that_raises_is_a_500_that_names_no_internals(raised: str) -> None:
    env_cls = {"KeyError": _Undescribable, "SystemExit": _Exiting}[raised]
    app = create_app(env_cls, _Bump, _Count, env_name="x", max_concurrent_envs=1)
    with run_server(app) as url:
        answer = httpx.get(f"{url}/metadata")
        assert answer.status_code == 500
        assert answer.json() == {"detail": f"get_metadata() raised {raised}"}
        assert httpx.get(f"{url}/health").json()["active_sessions"] == 0


async def test_a_get_metadata_past_reset_timeout_keeps_its_slot_until_it_returns() -> None:
    # Its environment was closed, and its slot freed, while get_metadata() ran on.
    app = create_app(
        _Stalling, _Bump, _Count, env_name="x", max_concurrent_envs=1, reset_timeout=0.2
    )
    with run_server(app) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            answer = await http.get("/metadata")
            assert answer.status_code == 500
            assert answer.json() == {"detail": "get_metadata() did not return within 0.2s"}
            assert _Stalling.closed_while_asking == []
            assert (await http.get("/health")).json()["active_sessions"] == 1
            _Stalling.gate.set()
            await slots_free(url)
        assert _Stalling.closed_while_asking == [False]


def test_bodies_that_are_too_big_or_not_json_are_refused_and_hold_nothing() -> None:
    app = create_app(_Counter, _Bump, _Count, env_name="c", max_concurrent_envs=1)
    with run_server(app) as url:
        huge = httpx.post(f"{url}/step", content=b'{"action": {"x": "' + b"y" * 2_000_000 + b'"}}')
        assert huge.status_code == 413
        assert "max_message_size" in huge.json()["detail"]
        garbage = httpx.post(f"{url}/reset", content=b"{not json")
        assert garbage.status_code == 400
        wrong = httpx.post(f"{url}/step", json={"action": [1, 2]})
        assert wrong.status_code == 422
        assert httpx.get(f"{url}/health").json()["active_sessions"] == 0
        assert call(url, "POST", "/reset", {})[0] == 200  # and the one slot is free


@pytest.mark.parametrize("path", ["/reset", "/step", "/tasks"])
async def test_a_client_that_leaves_mid_body_is_answered_and_nothing_is_raised(path: str) -> None:
    # What uvicorn hands the app when a client sends part of its body and hangs
    # up; whatever the app raises, uvicorn logs as a traceback, for every such client.
    app = create_app(_Counter, _Bump, _Count, env_name="c", max_concurrent_envs=1)
    arriving = iter(
        [{"type": "http.request", "body": b'{"act', "more_body": True}, {"type": "http.disconnect"}]
    )
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(arriving)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000"), (b"content-length", b"100")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 400
    assert b"left before sending its whole body" in sent[1]["body"]


class _Bump(Action):
    pass


class _Count(Observation):
    count: int = 0


class _Counter(Environment[_Bump, _Count, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> _Count:
        self.count = 0
        return _Count(count=0)

    def step(self, action: _Bump, timeout_s: float | None = None, **kw: Any) -> _Count:
        self.count += 1
        return _Count(count=self.count)

    @property
    def state(self) -> State:
        return State(step_count=self.count)


class _Raises(_Counter):
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> _Count:
        raise KeyError("secret")


class _Described(_Counter):
    made = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).made += 1

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="Described", description="says what it is", version="2.1", author="me"
        )


class _Undescribable(_Counter):
    def get_metadata(self) -> EnvironmentMetadata:
        raise KeyError("secret")


class _Exiting(_Counter):
    def get_metadata(self) -> EnvironmentMetadata:
        raise SystemExit(3)


class _Stalling(_Counter):
    """get_metadata() waits for ``gate``; close() notes whether it still runs."""

    gate = threading.Event()
    asking = threading.Event()
    closed_while_asking: list[bool] = []

    def get_metadata(self) -> EnvironmentMetadata:
        self.asking.set()
        self.gate.wait(30)
        self.asking.clear()
        return EnvironmentMetadata(name="late", description="too late")

    def close(self) -> None:
        self.closed_while_asking.append(self.asking.is_set())
