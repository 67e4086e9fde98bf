"""Several environments behind one server, each with its own cap and routes."""

from __future__ import annotations

import asyncio
import functools
import re
import threading
from collections.abc import Iterator

import pytest
from mcp import Client
from servers import Held, Hold, HoldingEnvironment, Ping, PingEnvironment, Pong, until
from tool_envs import HTTP
from websockets.asyncio.client import connect

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import (
    CapacityError,
    ConcurrencyConfig,
    ConcurrencyConfigurationError,
    ConnectionFailedError,
    EnvSpec,
    MultiEnvClient,
    NotFoundError,
    ServerPool,
    SyncMultiEnvClient,
    WebSocketEnvClient,
    create_multi_app,
)
from openenv.client import ws_url
from openenv.testing import run_server


def two_envs() -> object:
    return create_multi_app(
        {
            "counter": EnvSpec(
                CounterEnvironment,
                CounterAction,
                CounterObservation,
                ConcurrencyConfig(max_concurrent_envs=2),
                mcp=True,
            ),
            "ns/echo": EnvSpec(
                EchoEnvironment,
                EchoAction,
                EchoObservation,
                ConcurrencyConfig(max_concurrent_envs=1),
            ),
        }
    )


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with run_server(two_envs()) as url:
        yield url


def test_envs_are_listed(url: str) -> None:
    envs = HTTP.get(f"{url}/envs").json()["envs"]
    assert [(e["name"], e["path"], e["max_sessions"]) for e in envs] == [
        ("counter", "/envs/counter", 2),
        ("ns/echo", "/envs/ns/echo", 1),
    ]
    assert envs[0]["splits"] == ["train", "test"]
    assert envs[0]["tools"] == ["increment", "get_value", "submit"]
    assert envs[1]["metadata"]["name"] == "EchoEnvironment"
    assert (envs[1]["splits"], envs[1]["tools"]) == ([], [])


def test_each_env_has_its_own_introspection_routes(url: str) -> None:
    assert HTTP.get(f"{url}/envs/counter/health").json()["max_sessions"] == 2
    assert HTTP.get(f"{url}/envs/ns/echo/health").json()["max_sessions"] == 1
    assert HTTP.get(f"{url}/envs/counter/splits").json() == {"splits": ["train", "test"]}
    schema = HTTP.get(f"{url}/envs/ns/echo/schema").json()
    assert schema["action"] == EchoAction.model_json_schema()
    assert HTTP.get(f"{url}/envs/nope/health").status_code == 404
    assert HTTP.get(f"{url}/ws").status_code == 404  # no default environment


@pytest.mark.parametrize(
    "path",
    [
        "/envs",
        "/envs/counter/health",
        "/envs/ns/echo/metrics",
        "/envs/counter/splits",
        "/envs/counter/tools",
    ],
)
def test_every_get_route_answers_head_as_its_get(url: str, path: str) -> None:
    # Uptime monitors ask with HEAD, and take a 405 for a server that is down.
    head, get = HTTP.head(f"{url}{path}"), HTTP.get(f"{url}{path}")
    assert (head.status_code, get.status_code) == (200, 200)
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    paths = HTTP.get(f"{url}/openapi.json").json()["paths"]
    assert list(paths["/envs"]) == ["get"]  # the OpenAPI page lists each route once


async def test_two_environments_with_separate_caps(url: str) -> None:
    client = MultiEnvClient(url, capacity_timeout=0)
    counter, echo = client.environments.get("counter"), client.environments.get("ns/echo")
    tasks = await counter.list_tasks("train", limit=3)
    async with counter.session(tasks[0]) as a, counter.session(tasks[1]) as b:
        async with echo.session() as e:
            # counter is full (2/2) and echo is full (1/1), independently
            with pytest.raises(CapacityError) as full:
                await counter.session(tasks[2]).open()
            assert full.value.max_sessions == 2
            with pytest.raises(CapacityError) as full:
                await echo.session().open()
            assert full.value.max_sessions == 1
            listed = {i.name: i.active_sessions for i in await client.environments.list()}
            assert listed == {"counter": 2, "ns/echo": 1}
            echoed = await e.step({"message": "hi"})
            assert echoed.observation.echoed_message == "hi"  # type: ignore[attr-defined]
        await a.call_tool("increment", amount=1)
        await b.call_tool("increment", amount=5)
        assert (await a.call_tool("get_value")).data == 1
        assert (await b.call_tool("get_value")).data == 5
    listed = {i.name: i.active_sessions for i in await client.environments.list()}
    assert listed == {"counter": 0, "ns/echo": 0}


def test_the_sync_client_finds_environments(url: str) -> None:
    client = SyncMultiEnvClient(url)
    assert [e.name for e in client.environments.list()] == ["counter", "ns/echo"]
    counter = client.environments.get("counter")
    with counter.session(counter.list_tasks("test", limit=1)[0]) as session:
        target = session.task.target  # type: ignore[union-attr]
        session.call_tool("increment", amount=target)
        assert session.call_tool("submit").reward == 1.0
    with pytest.raises(NotFoundError):
        client.environments.get("missing").list_splits()


@pytest.mark.parametrize("name", ["", "/counter", "a//b", "has space", "a/"])
def test_bad_environment_names_are_refused(name: str) -> None:
    spec = EnvSpec(PingEnvironment, Ping, Pong)
    with pytest.raises(ValueError, match="environment name"):
        create_multi_app({name: spec})


def test_no_environments_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one environment"):
        create_multi_app({})


def test_each_spec_is_checked_like_create_app() -> None:
    class Unsafe(PingEnvironment):
        SUPPORTS_CONCURRENT_SESSIONS = False

    spec = EnvSpec(Unsafe, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4))
    with pytest.raises(ConcurrencyConfigurationError):
        create_multi_app({"unsafe": spec})


async def test_mcp_is_served_per_environment(url: str) -> None:
    async with Client(f"{url}/envs/counter/mcp") as mcp:
        assert [t.name for t in (await mcp.list_tools()).tools] == [
            "increment",
            "get_value",
            "submit",
        ]
        result = await mcp.call_tool("increment", {"amount": 2})
        assert result.structured_content["data"] == {"value": 2}  # type: ignore[index]
        assert HTTP.get(f"{url}/envs/counter/health").json()["active_sessions"] == 1
    assert HTTP.get(f"{url}/envs/ns/echo/mcp").status_code == 404  # echo did not ask for MCP


def test_the_root_asks_for_a_key_of_one_of_its_environments_and_lists_only_theirs() -> None:
    """security.md: every route but /health needs the key, and every request an
    allowed host; the root of a multi-environment server belongs to none of them."""

    def spec(key: str | None) -> EnvSpec:
        return EnvSpec(EchoEnvironment, EchoAction, EchoObservation, api_key=key)

    app = create_multi_app({"a": spec("key-a"), "b": spec("key-b")})
    with run_server(app) as url:
        for path in ("/envs", "/docs", "/openapi.json", "/redoc"):
            refused = HTTP.get(f"{url}{path}")
            assert refused.status_code == 401, (path, refused.text)
            assert HTTP.get(f"{url}{path}", headers={"X-API-Key": "wrong"}).status_code == 401
        listed = HTTP.get(f"{url}/envs", headers={"Authorization": "Bearer key-b"})
        assert [env["name"] for env in listed.json()["envs"]] == ["b"]
        assert HTTP.get(f"{url}/openapi.json", headers={"X-API-Key": "key-a"}).status_code == 200
        rebound = HTTP.get(f"{url}/envs", headers={"X-API-Key": "key-a", "Host": "evil.example"})
        assert rebound.status_code == 403, rebound.text
        # A path under /envs/ that no environment is mounted at is the root's:
        # without a key it says nothing, not even which environments there are.
        for path in ("/envs/x/tools", "/envs/x/splits"):
            refused = HTTP.get(f"{url}{path}", headers={"X-Session-ID": "s"})
            assert refused.status_code == 401, (path, refused.text)
            assert refused.json() == {"detail": "missing API key"}
        # Each environment's own routes keep their own key, and /health stays public.
        assert HTTP.get(f"{url}/envs/a/health").status_code == 200
        assert HTTP.get(f"{url}/envs/a/schema", headers={"X-API-Key": "key-b"}).status_code == 401
        assert HTTP.get(f"{url}/envs/a/schema", headers={"X-API-Key": "key-a"}).status_code == 200
    # With no key set anywhere, the root needs none, and lists every environment.
    with run_server(create_multi_app({"a": spec(None), "b": spec(None)})) as url:
        assert [env["name"] for env in HTTP.get(f"{url}/envs").json()["envs"]] == ["a", "b"]
        assert HTTP.get(f"{url}/docs").status_code == 200


def test_openrewards_listing_and_unknown_names_show_a_key_only_its_environments() -> None:
    # As GET /envs: a client holding one environment's key is not told the
    # names of the environments other keys open.
    def spec(key: str) -> EnvSpec:
        return EnvSpec(EchoEnvironment, EchoAction, EchoObservation, api_key=key)

    app = create_multi_app({"a": spec("key-a"), "b": spec("key-b"), "c": spec("key-b")})
    with run_server(app) as url:
        key_b = {"X-API-Key": "key-b", "X-Session-ID": "s"}
        listed = HTTP.get(f"{url}/list_environments", headers=key_b)
        assert listed.json() == ["b", "c"]
        unknown = HTTP.get(f"{url}/nope/tools", headers=key_b)
        assert unknown.status_code == 404
        assert unknown.json()["detail"] == "unknown environment 'nope'; this server has: b, c"
        stranger = HTTP.get(f"{url}/nope/tools", headers={"X-Session-ID": "s"})
        assert stranger.status_code == 401  # no key of any: told nothing
        assert stranger.json() == {"detail": "missing API key"}


async def test_the_root_health_sums_every_environment_and_says_which_is_unwell() -> None:
    """Load balancers and Docker's HEALTHCHECK ask the root's /health, as on a
    one-environment server; it is healthy only when every environment is."""
    entered, gate = threading.Semaphore(0), threading.Event()
    held = EnvSpec(
        functools.partial(HoldingEnvironment, entered, gate),
        Hold,
        Held,
        ConcurrencyConfig(max_concurrent_envs=3),
        max_threads=1,
        api_key="key-h",
    )
    echo = EnvSpec(EchoEnvironment, EchoAction, EchoObservation)
    with run_server(create_multi_app({"held": held, "echo": echo})) as url:
        head = HTTP.head(f"{url}/health")
        assert (head.status_code, head.content) == (200, b"")
        assert HTTP.get(f"{url}/health").json() == {
            "status": "healthy",
            "active_sessions": 0,
            "max_sessions": 4,
            "queued_sessions": 0,
            "protocol_version": 1,
            "workers": 1,
            # Public, as /health is: an environment behind a key is only counted.
            "envs": {
                "echo": {
                    "status": "healthy",
                    "active_sessions": 0,
                    "max_sessions": 1,
                    "queued_sessions": 0,
                    "protocol_version": 1,
                    "workers": 1,
                }
            },
        }
        key = {"X-API-Key": "key-h"}
        sockets = [
            await connect(f"{ws_url(url)[:-3]}/envs/held/ws", additional_headers=key)
            for _ in range(3)
        ]
        try:
            for ws in sockets:
                await ws.send('{"type": "reset"}')
                await ws.recv()
            # Two steps block both lanes of threads (max_threads=1); a third waits.
            for ws in sockets[:2]:
                await ws.send('{"type": "step", "data": {"wait": true}}')
                assert await asyncio.to_thread(entered.acquire, True, 10)
            await sockets[2].send('{"type": "step", "data": {}}')

            async def degraded() -> bool:
                return HTTP.get(f"{url}/health").json()["status"] == "degraded"

            await until(degraded, what="the root's /health reporting held's waiting call")
            seen = HTTP.get(f"{url}/health", headers=key).json()
            assert seen["reason"].startswith("held: degraded (1 environment call(s) wait")
            assert (seen["active_sessions"], seen["envs"]["held"]["active_sessions"]) == (3, 3)
            assert seen["envs"]["held"]["status"] == "degraded"
            assert seen["envs"]["echo"]["status"] == "healthy"
            stranger = HTTP.get(f"{url}/health").json()
            assert stranger["reason"] == "1 environment(s) that need another key: not healthy"
            assert list(stranger["envs"]) == ["echo"]
        finally:
            gate.set()
            for ws in sockets:
                await ws.close()

        async def healthy() -> bool:
            return HTTP.get(f"{url}/health").json()["status"] == "healthy"

        await until(healthy, what="the root's /health healthy again")
        # A pool reads /health to place sessions on /ws, which the root has not.
        pool = ServerPool([url], wait=0)
        # It answered: the pool says what the root is, and where the environments are.
        root = re.escape(url)  # held needs a key the pool lacks: echo only is named
        said = rf"{root} is the root of a server of several environments.+\({root}/envs/echo\)"
        with pytest.raises(ConnectionFailedError, match=said):
            async with WebSocketEnvClient(pool, action_cls=Hold, observation_cls=Held) as env:
                await env.reset()
