"""DNS rebinding: a page whose host name now points at this server gets 403 everywhere.

A rebinding request is a request to 127.0.0.1 that carries the attacker's
name in ``Host`` (and, from a page, the same name in ``Origin``), so the tests
send exactly that over real sockets to real servers.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx
import orjson
import pytest
from servers import Ping, PingEnvironment, Pong, Tracker
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, create_app
from openenv.testing import run_server

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "page", "version": "0"},
    },
}
MCP_HEADERS = {"accept": "application/json, text/event-stream"}


class TrackedCounter(CounterEnvironment):
    tracker = Tracker()

    def __init__(self) -> None:
        super().__init__()
        self.tracker.on_create(self)


def ping_app(tracker: Tracker, **settings: Any) -> Any:
    return create_app(
        functools.partial(PingEnvironment, tracker),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=4),
        **settings,
    )


@pytest.fixture(autouse=True)
def _no_host_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENENV_ALLOWED_HOSTS", "OPENENV_ALLOWED_ORIGINS", "OPENENV_API_KEY"):
        monkeypatch.delenv(name, raising=False)


async def open_ws(url: str, path: str, host: str, origin: str | None = None) -> dict[str, Any]:
    """Open ``path`` on the server at ``url`` with ``host`` in the Host header; ask for state."""
    port = int(url.rsplit(":", 1)[1])
    async with connect(
        f"ws://{host}{path}",
        host="127.0.0.1",
        port=port,
        origin=origin,  # type: ignore[arg-type]
    ) as ws:
        await ws.send('{"type": "state"}')
        reply: dict[str, Any] = orjson.loads(await ws.recv())
        return reply


async def test_a_rebound_page_cannot_open_websocket_sessions() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker)) as url:
        port = url.rsplit(":", 1)[1]
        for path in ("/ws", "/web/ws"):
            with pytest.raises(InvalidStatus) as refused:
                await open_ws(url, path, f"evil.example:{port}", f"http://evil.example:{port}")
            assert refused.value.response.status_code == 403
            body = orjson.loads(refused.value.response.body)
            assert "host 'evil.example' is not allowed" in body["detail"]
            assert "OPENENV_ALLOWED_HOSTS=evil.example" in body["detail"]
        assert tracker.created == []
        # What programs and benchmarks use still works: localhost names and IP literals.
        for host in (f"localhost:{port}", f"app.localhost:{port}", f"127.0.0.1:{port}"):
            reply = await open_ws(url, "/ws", host, f"http://{host}")
            assert reply["type"] == "state"
        reply = await open_ws(url, "/web/ws", f"10.1.2.3:{port}", f"http://10.1.2.3:{port}")
        assert reply["type"] == "state"
        assert (await open_ws(url, "/ws", f"[::1]:{port}"))["type"] == "state"
    assert len(tracker.created) == 5


def test_a_rebound_page_cannot_reach_http_routes() -> None:
    with run_server(ping_app(Tracker())) as url, httpx.Client(base_url=url) as http:
        for path in ("/schema", "/health", "/metadata", "/web"):
            refused = http.get(path, headers={"Host": "evil.example"})
            assert refused.status_code == 403, path
            assert "DNS rebinding" in refused.json()["detail"]
            assert http.get(path).status_code == 200, path


def test_every_host_gets_its_own_answer_among_many_different_ones() -> None:
    # More Host values than the server keeps answers for, and each asked again
    # after the others: a kept answer never leaks to another name.
    hosts = [f"evil{i}.example" for i in range(100)] + [f"10.0.0.{i}" for i in range(100)]
    with run_server(ping_app(Tracker())) as url, httpx.Client(base_url=url) as http:
        for _ in range(2):
            for host in hosts:
                status = http.get("/health", headers={"Host": host}).status_code
                assert status == (403 if host.startswith("evil") else 200), host


def test_a_rebound_page_cannot_open_mcp_sessions() -> None:
    TrackedCounter.tracker = Tracker()
    app = create_app(
        TrackedCounter,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=4),
        mcp=True,
    )
    with run_server(app) as url:
        port = url.rsplit(":", 1)[1]
        with httpx.Client(base_url=url, headers=MCP_HEADERS) as http:
            rebound = http.post(
                "/mcp",
                json=INITIALIZE,
                headers={"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"},
            )
            assert rebound.status_code == 403
            # A foreign page that reaches the server by its real address: its Origin is refused.
            foreign = http.post("/mcp", json=INITIALIZE, headers={"Origin": "http://evil.example"})
            assert foreign.status_code == 403
            assert foreign.json()["detail"] == "origin http://evil.example may not open sessions"
            assert TrackedCounter.tracker.created == []
            # A program (no Origin), and the server's own page, still get in.
            assert http.post("/mcp", json=INITIALIZE).status_code == 200
            own = http.post("/mcp", json=INITIALIZE, headers={"Origin": url})
            assert own.status_code == 200
        assert len(TrackedCounter.tracker.created) == 2


async def test_listed_host_names_are_served(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, allowed_hosts=("env.example", "*.corp.example"))) as url:
        port = url.rsplit(":", 1)[1]
        for host in (f"env.example:{port}", f"a.b.corp.example:{port}"):
            assert (await open_ws(url, "/ws", host, f"http://{host}"))["type"] == "state"
        with pytest.raises(InvalidStatus):
            await open_ws(url, "/ws", f"corp.example:{port}")
        # A listed host does not make another listed host's page same-origin.
        with pytest.raises(InvalidStatus):
            await open_ws(url, "/ws", f"env.example:{port}", f"http://a.corp.example:{port}")
    monkeypatch.setenv("OPENENV_ALLOWED_HOSTS", "env.example, other.example")
    with run_server(ping_app(tracker)) as url:
        port = url.rsplit(":", 1)[1]
        for host in ("env.example", "other.example"):
            assert (await open_ws(url, "/ws", f"{host}:{port}"))["type"] == "state"
    monkeypatch.setenv("OPENENV_ALLOWED_HOSTS", "*")
    with run_server(ping_app(tracker)) as url:
        port = url.rsplit(":", 1)[1]
        assert (await open_ws(url, "/ws", f"anything.example:{port}"))["type"] == "state"


async def test_origins_listed_in_the_environment_may_open_sessions_and_no_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """security.md: ``allowed_origins`` defaults to ``OPENENV_ALLOWED_ORIGINS``,
    comma-separated; a page from any other origin still gets 403."""
    monkeypatch.setenv("OPENENV_ALLOWED_ORIGINS", "https://a.example, http://B.example:8080/")
    tracker = Tracker()
    with run_server(ping_app(tracker)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            host = url.removeprefix("http://")
            for origin in ("https://a.example", "http://b.example:8080"):
                assert (await open_ws(url, "/ws", host, origin))["type"] == "state"
                reset = await http.post("/reset", json={}, headers={"Origin": origin})
                assert reset.status_code == 200
            for origin in ("http://a.example", "https://a.example:8443", "http://c.example"):
                with pytest.raises(InvalidStatus) as refused:
                    await open_ws(url, "/ws", host, origin)
                assert refused.value.response.status_code == 403
                reset = await http.post("/reset", json={}, headers={"Origin": origin})
                assert reset.status_code == 403
    assert len(tracker.created) == 4


def test_mounted_environments_check_hosts_and_origins_too() -> None:
    from openenv import EnvSpec, create_multi_app

    TrackedCounter.tracker = Tracker()
    spec = EnvSpec(TrackedCounter, CounterAction, CounterObservation, mcp=True)
    with (
        run_server(create_multi_app({"counter": spec})) as url,
        httpx.Client(base_url=url, headers=MCP_HEADERS) as http,
    ):
        mcp = "/envs/counter/mcp"
        assert http.get("/envs/counter/schema", headers={"Host": "evil.example"}).status_code == 403
        assert http.post(mcp, json=INITIALIZE, headers={"Host": "evil.example"}).status_code == 403
        foreign = http.post(mcp, json=INITIALIZE, headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        assert TrackedCounter.tracker.created == []
        assert http.post(mcp, json=INITIALIZE).status_code == 200
