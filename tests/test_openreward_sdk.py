"""OpenReward's real SDK drives openenv servers over OpenReward's HTTP session protocol.

The ``openreward`` SDK pins ``sse-starlette==2.3.6`` and the ``mcp`` extra needs
``>=3``, so it lives in a virtual environment of its own: ``make`` builds
``.venv-openreward`` from ``tests/apps/openreward_requirements.txt``, and without
it this test builds one (from PyPI). ``tests/apps/openreward_client.py`` runs
there and prints what the SDK saw. The protocol's edges (cap shared with
``/ws``, idle reaping, sessions ids) are checked over plain HTTP as well.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from peer_venvs import peer_python, run_peer_script

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, EnvError, EnvSpec, create_app, create_multi_app, tool
from openenv.server import openreward_wire
from openenv.testing import run_server

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "tests" / "apps" / "openreward_client.py"
REQUIREMENTS = ROOT / "tests" / "apps" / "openreward_requirements.txt"
KEY = "or-test-key"
pytestmark = pytest.mark.timeout(300)


class Trap(CounterEnvironment):
    """The counter, plus a tool that raises and one that takes its time."""

    @tool
    def explode(self) -> str:
        """Raise, with a message that must not reach the client."""
        raise RuntimeError("secret internals")

    @tool
    def refuse(self) -> str:
        """Refuse, with a message of several lines for the model."""
        raise EnvError("that move is not allowed:\nthe board has no square z9\r\ntry a1 to h8")

    slept: ClassVar[list[float]] = []

    @tool
    async def slow(self, seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        Trap.slept.append(seconds)
        return "slept"


@pytest.fixture(scope="module")
def sdk_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with the pinned SDK: make's ``.venv-openreward``, else a fresh venv."""
    return peer_python(tmp_path_factory, REQUIREMENTS, ".venv-openreward")


def run_sdk(python: Path, mode: str, url: str, name: str, key: str, *extra: str) -> Any:
    return run_peer_script(
        python,
        SCRIPT,
        mode,
        url,
        name,
        key,
        *extra,
        unset=("OPENREWARD_API_KEY",),
        env={"OPENREWARD_DISABLE_UPDATE_CHECK": "1"},  # no PyPI look-up from the SDK
        timeout=240,
    )


def counter_app(**settings: Any) -> Any:
    cap = settings.pop("cap", 8)
    concurrency = ConcurrencyConfig(
        max_concurrent_envs=cap,
        queue_timeout=settings.pop("queue_timeout", 0),
        session_timeout=settings.pop("session_timeout", 300),
    )
    factory = settings.pop("factory", CounterEnvironment)
    return create_app(factory, CounterAction, CounterObservation, concurrency, **settings)


def active(url: str, key: str = KEY, path: str = "") -> int:
    health = httpx.get(f"{url}{path}/health", headers={"X-API-Key": key}).json()
    count: int = health["active_sessions"]
    return count


def wait_for_no_sessions(url: str, path: str = "", within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while active(url, path=path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert active(url, path=path) == 0


def test_documented_sync_and_async_flows(sdk_python: Path) -> None:
    with run_server(counter_app(api_key=KEY)) as url:
        sync = run_sdk(sdk_python, "sync", url, "counter", KEY)
        done = run_sdk(sdk_python, "async", url, "counter", KEY)
        wait_for_no_sessions(url)
        metrics = httpx.get(f"{url}/metrics", headers={"X-API-Key": KEY}).text
    assert sync["splits"] == ["train", "test"]
    assert sync["num_tasks"] == 1000
    assert sync["num_tasks_call"] == 100
    assert sync["task_7"] == {"id": "train-7", "target": 3}
    assert sync["range"] == ["train-2", "train-3", "train-4"]
    assert sync["env_tools"] == sync["session_tools"] == ["increment", "get_value", "submit"]
    assert sync["openai_tools"][0]["parameters"]["required"] == ["amount"]
    assert sync["task"] == {"id": "train-3", "target": 5}
    assert sync["task_env"] == "CounterEnvironment"
    assert "exactly 5" in sync["prompt"]
    assert json.loads(sync["increment"]) == {"value": 5}
    assert (sync["reward"], sync["finished"], sync["submit_text"]) == (1.0, True, "correct")
    assert sync["after_finish"] == "episode_finished"
    assert done["prompt"].endswith("exactly 10, then call submit().")
    assert (done["value"], done["reward"], done["finished"]) == ("100", 0.0, True)
    assert 'openenv_sessions_closed_total{reason="openreward_client_close"} 2.0' in metrics


def test_thousand_sessions_through_the_async_sdk_respect_the_cap(sdk_python: Path) -> None:
    cap = 64
    app = counter_app(cap=cap, queue_timeout=120, api_key=KEY)
    seen: list[int] = []
    stop = threading.Event()

    def watch(url: str) -> None:
        with httpx.Client(headers={"X-API-Key": KEY}) as http:
            while not stop.is_set():
                seen.append(http.get(f"{url}/health").json()["active_sessions"])
                time.sleep(0.01)

    with run_server(app) as url:
        watcher = threading.Thread(target=watch, args=(url,), daemon=True)
        watcher.start()
        try:
            report = run_sdk(sdk_python, "many", url, "counter", KEY, "1000")
        finally:
            stop.set()
            watcher.join()
        wait_for_no_sessions(url)
        metrics = httpx.get(f"{url}/metrics", headers={"X-API-Key": KEY}).text
    assert report["errors"] == []
    assert report["rewards"] == [1.0] * 1000
    assert max(seen) <= cap
    assert max(seen) > 1  # they did run side by side
    assert "openenv_sessions_opened_total 1000.0" in metrics
    assert 'openenv_sessions_closed_total{reason="openreward_client_close"} 1000.0' in metrics


def test_bad_requests_get_precise_errors_and_leak_no_slot(sdk_python: Path) -> None:
    with run_server(counter_app(factory=Trap, api_key=KEY)) as url:
        report = run_sdk(sdk_python, "attacks", url, "trap", KEY)
        wait_for_no_sessions(url)
    # A one-environment server serves its environment at bare paths whatever the
    # SDK's name for it (X-Deployment); a path that names another is unknown.
    assert "ok" in report["unknown_env"]
    assert report["unknown_variant"]["status"] == 404
    unknown = report["unknown_variant"]["message"]
    assert "unknown environment 'nope'; this server has: Trap" in unknown
    assert report["bad_split"]["status"] == 400
    assert "unknown split 'nosuch'" in report["bad_split"]["message"]
    assert report["bad_index"]["status"] == 400
    assert "has 1000 tasks, no index 1000000" in report["bad_index"]["message"]
    assert report["wrong_key"]["type"] == "AuthenticationError"
    assert "wrong API key" in report["wrong_key"]["message"]
    assert report["missing_key"]["type"] == "AuthenticationError"
    assert "missing API key" in report["missing_key"]["message"]
    assert report["unknown_tool"]["reason"] == "not_found"
    assert "unknown tool 'nosuch'" in report["unknown_tool"]["detail"]
    assert report["bad_arguments"]["reason"] == "input_validation"
    assert "amount" in report["bad_arguments"]["detail"]
    raised = report["tool_raised"]["message"]
    assert "[EXECUTION_ERROR] tool 'explode' raised RuntimeError" in raised
    assert "secret internals" not in raised
    assert report["after_raise"]["type"] == "SessionTerminatedError"
    assert report["bad_sid_call"]["status"] == 404
    assert "unknown session id" in report["bad_sid_call"]["body"]["detail"]
    assert report["bad_sid_create"]["status"] == 404
    assert "open one with POST /create_session" in report["bad_sid_create"]["body"]["detail"]
    assert report["no_sid"] == {
        "status": 400,
        "body": {"detail": "X-Session-ID header is required"},
    }
    assert report["ended_ping"]["status"] == 410
    assert "has ended (client close)" in report["ended_ping"]["body"]["detail"]


def test_a_message_of_several_lines_reaches_the_sdk_whole(sdk_python: Path) -> None:
    # Sent as one data line, its second line ended the event, and the SDK's
    # parser raised ValueError (not enough values to unpack) on it.
    with run_server(counter_app(factory=Trap, api_key=KEY)) as url:
        report = run_sdk(sdk_python, "failure", url, "trap", KEY, "refuse")
        wait_for_no_sessions(url)
    assert report["type"] == "ToolFailed"
    assert report["message"].endswith(
        "[EXECUTION_ERROR] tool 'refuse' raised EnvError: that move is not allowed:\n"
        "the board has no square z9\ntry a1 to h8"
    )


def test_a_client_that_vanishes_mid_stream_is_reaped(sdk_python: Path) -> None:
    app = counter_app(factory=Trap, api_key=KEY, session_timeout=1.0, reap_interval=0.1)
    with run_server(app) as url:
        report = run_sdk(sdk_python, "disconnect", url, "trap", KEY)
        assert report["first_line"] == "event: task_id"
        wait_for_no_sessions(url, within=15)
        ping = httpx.post(f"{url}/ping", headers={"X-API-Key": KEY, "X-Session-ID": report["sid"]})
    assert ping.status_code == 410
    assert "idle timeout" in ping.json()["detail"]


def test_multi_environment_server(sdk_python: Path) -> None:
    concurrency = ConcurrencyConfig(max_concurrent_envs=4)
    app = create_multi_app(
        {
            "counter": EnvSpec(CounterEnvironment, CounterAction, CounterObservation, concurrency),
            "ns/trap": EnvSpec(Trap, CounterAction, CounterObservation, concurrency, api_key=KEY),
        }
    )
    with run_server(app) as url:
        # The SDK's name picks the environment (X-Deployment), with or without a namespace.
        sync = run_sdk(sdk_python, "sync", url, "counter", "")
        done = run_sdk(sdk_python, "async", url, "team/counter", "")
        trap = run_sdk(sdk_python, "attacks", url, "ns/trap", KEY)
        wait_for_no_sessions(url, path="/envs/counter")
        wait_for_no_sessions(url, path="/envs/ns/trap")
        listed = httpx.get(f"{url}/list_environments").json()
        listed_with_key = httpx.get(f"{url}/list_environments", headers={"X-API-Key": KEY}).json()
    assert (sync["reward"], sync["task_env"]) == (1.0, "counter")
    assert done["reward"] == 0.0
    assert trap["unknown_env"]["status"] == 404
    assert (
        "unknown environment 'nope'; this server has: counter, ns/trap"
        in (trap["unknown_env"]["message"])
    )
    assert "wrong API key" in trap["wrong_key"]["message"]
    assert trap["unknown_tool"]["reason"] == "not_found"
    assert trap["after_raise"]["type"] == "SessionTerminatedError"
    # Without its key, the keyed environment is not even named.
    assert (listed, listed_with_key) == (["counter"], ["counter", "ns/trap"])


# -- the protocol over plain HTTP ------------------------------------------------------


def open_sid(http: httpx.Client) -> str:
    stream = http.post("/create_session")
    assert stream.headers["content-type"].startswith("text/event-stream")
    match = re.search(r"event: task_id\r?\ndata: (\w+)", stream.text)
    assert match is not None, stream.text
    return match.group(1)


@pytest.fixture
def served() -> Iterator[str]:
    with run_server(counter_app(cap=2, session_timeout=300)) as url:
        yield url


def test_http_sessions_and_websockets_share_one_cap(served: str) -> None:
    from counter_env import CounterEnv

    with httpx.Client(base_url=served) as http, CounterEnv(served).sync() as ws_env:
        ws_env.reset()
        sid = open_sid(http)
        task = {"split": "train", "index": 0}
        created = http.post("/create", json=task, headers={"X-Session-ID": sid})
        assert created.json() == {"sid": sid}
        assert active(served) == 2
        refused = http.post(
            "/create", json={"split": "train", "index": 1}, headers={"X-Session-ID": open_sid(http)}
        )
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert "at capacity (2 sessions)" in refused.json()["detail"]
        http.post("/delete", headers={"X-Session-ID": sid})
        assert active(served) == 1


def test_catalogue_routes_keep_their_openenv_shape_without_a_session_header(served: str) -> None:
    with httpx.Client(base_url=served) as http:
        assert http.get("/splits").json() == {"splits": ["train", "test"]}
        assert http.get("/tools").json()["tools"][0]["name"] == "increment"
        headers = {"X-Session-ID": open_sid(http)}
        assert http.get("/splits", headers=headers).json() == [
            {"name": "train", "type": "train"},
            {"name": "test", "type": "test"},
        ]
        assert http.get("/tools", headers=headers).json()["terminal_tool"] is None
        assert http.get("/CounterEnvironment/splits", headers=headers).status_code == 200
        assert http.get("/counterenvironment/splits", headers=headers).status_code == 200
        assert http.post("/tasks", json={"split": "test"}).json()["tasks"][0]["id"] == "test-0"


def test_forged_and_reused_session_ids(served: str) -> None:
    with httpx.Client(base_url=served) as http:
        body = {"split": "train", "index": 0}
        forged = http.post("/create", json=body, headers={"X-Session-ID": "1"})
        assert forged.status_code == 404
        sid = open_sid(http)
        assert http.post("/create", json=body, headers={"X-Session-ID": sid}).status_code == 200
        again = http.post("/create", json=body, headers={"X-Session-ID": sid})
        assert (again.status_code, again.json()) == (400, {"detail": "Session already exists"})
        fresh = {"X-Session-ID": open_sid(http)}
        both = http.post("/create", json={**body, "task_spec": {}}, headers=fresh)
        assert both.status_code == 422
        assert "not both/neither" in both.json()["detail"]
        assert http.post("/delete", headers={"X-Session-ID": sid}).json() == {"sid": sid}
        assert http.post("/delete", headers={"X-Session-ID": sid}).status_code == 200  # idempotent
        assert active(served) == 0


def test_a_toolset_is_refused_before_any_slot_is_taken(served: str) -> None:
    """compat.md: "built-in toolsets (``toolset=`` is 400)"; the id stays good for a
    session without one."""
    with httpx.Client(base_url=served) as http:
        sid = {"X-Session-ID": open_sid(http)}
        body = {"split": "train", "index": 0}
        refused = http.post("/create", json={**body, "toolset_name": "bash"}, headers=sid)
        assert refused.status_code == 400
        assert refused.json()["detail"] == "unknown toolset 'bash': openenv serves no toolsets"
        assert active(served) == 0
        assert http.post("/create", json=body, headers=sid).status_code == 200
        assert active(served) == 1
        http.post("/delete", headers=sid)
        assert active(served) == 0


def test_a_broken_stream_resumes_without_running_the_tool_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(openreward_wire, "KEEPALIVE_SECONDS", 0.05)
    Trap.slept.clear()
    with run_server(counter_app(factory=Trap)) as url, httpx.Client(base_url=url) as http:
        headers = {"X-Session-ID": open_sid(http)}
        http.post("/create", json={"split": "train", "index": 0}, headers=headers)
        call = {"name": "slow", "input": {"seconds": 0.5}}
        with http.stream("POST", "/call", json=call, headers=headers) as stream:
            lines = stream.iter_lines()
            assert next(lines) == "event: task_id"
            task_id = next(lines).removeprefix("data: ")
        # The client left mid-stream; the SDK's retry names the call it started.
        resumed = http.post("/call", json={**call, "task_id": task_id}, headers=headers)
        assert ": keepalive" in resumed.text
        end = resumed.text.split("event: end\r\ndata: ", 1)[1].strip()
        assert json.loads(end)["output"]["blocks"][0]["text"] == "slept"
        assert Trap.slept == [0.5]
        unknown = http.post("/call", json={**call, "task_id": "nope"}, headers=headers)
        assert "event: error\r\ndata: unknown task_id 'nope'" in unknown.text
        assert http.post("/delete", headers=headers).status_code == 200
        assert active(url) == 0


def test_delete_waits_for_the_call_in_flight() -> None:
    with run_server(counter_app(factory=Trap)) as url, httpx.Client(base_url=url) as http:
        headers = {"X-Session-ID": open_sid(http)}
        http.post("/create", json={"split": "train", "index": 0}, headers=headers)
        call = {"name": "slow", "input": {"seconds": 0.5}}
        with http.stream("POST", "/call", json=call, headers=headers) as stream:
            lines = stream.iter_lines()
            assert next(lines) == "event: task_id"
            deleted = http.post("/delete", headers=headers)  # while the tool sleeps
            rest = "\n".join(lines)
        assert deleted.json() == {"sid": headers["X-Session-ID"]}
        assert '"text":"slept"' in rest  # the call finished before the environment closed
        after = http.post("/call", json=call, headers=headers)
        assert after.status_code == 410
        assert active(url) == 0


def test_a_body_over_max_message_size_gets_413_and_the_session_goes_on() -> None:
    app = counter_app(cap=2, max_message_size=4096)
    with run_server(app) as url, httpx.Client(base_url=url) as http:
        headers = {"X-Session-ID": open_sid(http)}
        task = {"split": "train", "index": 0}
        big = http.post("/create", json={**task, "pad": "x" * 5000}, headers=headers)
        assert big.status_code == 413
        assert big.json() == {"detail": "request body over 4096 bytes (max_message_size)"}
        # One that only announces a gigabyte is refused before it sends any of it.
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as raw:
            raw.sendall(
                f"POST /create HTTP/1.1\r\nhost: {host}\r\nx-session-id: "
                f"{headers['X-Session-ID']}\r\ncontent-length: 1000000000\r\n\r\n".encode()
            )
            assert raw.recv(64).startswith(b"HTTP/1.1 413 ")
        assert http.post("/create", json=task, headers=headers).json() == {
            "sid": headers["X-Session-ID"]
        }


class Gated(CounterEnvironment):
    """The counter, plus a tool that waits (on a thread) until the test opens the gate."""

    gate: ClassVar[threading.Event] = threading.Event()

    @tool
    def wait(self) -> str:
        """Wait for the gate."""
        assert Gated.gate.wait(60)
        return "through"


async def test_calls_piling_up_on_one_session_are_bounded() -> None:
    """Calls of one session run one at a time and outlive their requests: without a
    bound, one client could queue work and memory (each call's arguments) at will."""
    from openenv.server.openreward import MAX_QUEUED_CALLS

    Gated.gate.clear()
    with run_server(counter_app(factory=Gated)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            opened = (await http.post("/create_session")).text
            headers = {"X-Session-ID": opened.split("data: ", 1)[1].split()[0]}
            task = {"split": "train", "index": 0}
            assert (await http.post("/create", json=task, headers=headers)).status_code == 200

            async def call(tool_name: str, started: asyncio.Event) -> str:
                body = {"name": tool_name, "input": {}}
                async with http.stream("POST", "/call", json=body, headers=headers) as stream:
                    assert stream.status_code == 200
                    lines = stream.aiter_lines()
                    assert await anext(lines) == "event: task_id"
                    started.set()
                    return "\n".join([line async for line in lines])

            events = [asyncio.Event() for _ in range(MAX_QUEUED_CALLS)]
            calls = [asyncio.create_task(call("wait", e)) for e in events]
            try:
                for event in events:
                    await asyncio.wait_for(event.wait(), 30)
                body = {"name": "wait", "input": {}}
                async with http.stream("POST", "/call", json=body, headers=headers) as refused:
                    assert refused.status_code == 429
                    detail = json.loads(await refused.aread())["detail"]
                assert f"{MAX_QUEUED_CALLS} tool calls running or waiting" in detail
            finally:
                Gated.gate.set()
            results = await asyncio.gather(*calls)
            assert all('"text":"through"' in r for r in results)
            # Room again, and the session goes on.
            done = await call("get_value", asyncio.Event())
            assert '"text":"0"' in done, done
            assert (await http.post("/delete", headers=headers)).status_code == 200
        assert active(url) == 0
