"""API keys and Origin checks: refused before any session or environment exists."""

from __future__ import annotations

import functools
import logging
import re

import httpx
import orjson
import pytest
from servers import Ping, PingEnvironment, Pong, Tracker
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from openenv import (
    AuthenticationError,
    ConcurrencyConfig,
    MuxClient,
    WebSocketEnvClient,
    create_app,
)
from openenv.adapters.gymnasium import RemoteVectorEnv, create_gymnasium_app
from openenv.client import ws_url
from openenv.testing import run_server

KEY = "s3cret-key"


def keyed_app(tracker: Tracker, **settings: object) -> object:
    return create_app(functools.partial(PingEnvironment, tracker), Ping, Pong, **settings)


def client(url: str, **options: object) -> WebSocketEnvClient:
    return WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong, **options)  # type: ignore[arg-type]


@pytest.fixture
def keyed_url(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("OPENENV_API_KEY", raising=False)
    tracker = Tracker()
    with run_server(keyed_app(tracker, api_key=KEY)) as url:
        yield url, tracker


def test_http_routes_need_the_key_except_health(keyed_url: tuple[str, Tracker]) -> None:
    url, _ = keyed_url
    with httpx.Client(base_url=url) as http:
        assert http.get("/health").status_code == 200
        for path in ("/schema", "/metadata", "/metrics", "/docs"):
            missing = http.get(path)
            assert missing.status_code == 401, path
            assert missing.headers["www-authenticate"] == "Bearer"
            assert http.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
            assert http.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert http.get("/schema", params={"api_key": KEY}).status_code == 200


def test_only_the_web_pages_own_files_are_public(keyed_url: tuple[str, Tracker]) -> None:
    url, _ = keyed_url
    with httpx.Client(base_url=url) as http:
        assert http.get("/web").status_code == 200
        assert http.get("/web/app.js").status_code == 200
        # Deeper paths under /web/ reach OpenReward's /{env}/... routes: they are
        # not the page's files, and without the key say nothing of the server.
        for path in ("/web/x/tools", "/web/x/splits"):
            refused = http.get(path, headers={"X-Session-ID": "s"})
            assert refused.status_code == 401, path
            assert "PingEnvironment" not in refused.text
        refused = http.post("/web/x/tasks", json={"split": "train"})
        assert refused.status_code == 401
        assert "PingEnvironment" not in refused.text


async def test_websocket_without_or_with_wrong_key_creates_nothing(
    keyed_url: tuple[str, Tracker],
) -> None:
    url, tracker = keyed_url
    with pytest.raises(AuthenticationError, match="missing API key"):
        await client(url).reset()
    with pytest.raises(AuthenticationError, match="wrong API key"):
        await client(url, api_key="wrong").reset()
    assert tracker.created == []
    async with client(url, api_key=KEY) as env:
        assert (await env.reset()).observation.message == "reset:None"
    assert len(tracker.created) == 1


async def test_a_refused_handshake_logs_no_error(
    keyed_url: tuple[str, Tracker], caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = keyed_url
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        with pytest.raises(AuthenticationError):
            await client(url).reset()
        async with client(url, api_key=KEY) as env:  # the server goes on serving
            await env.reset()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []  # a correct 401 is not "returned without completing handshake"


async def test_key_from_the_environment_variable(
    keyed_url: tuple[str, Tracker], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = keyed_url
    monkeypatch.setenv("OPENENV_API_KEY", KEY)
    async with client(url) as env:
        assert (await env.step(Ping())).observation.count == 1


async def test_browser_style_key_in_a_subprotocol(keyed_url: tuple[str, Tracker]) -> None:
    url, _ = keyed_url
    async with connect(ws_url(url), subprotocols=["openenv", f"openenv.key.{KEY}"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "openenv"
        await ws.send('{"type": "state"}')
        assert orjson.loads(await ws.recv())["type"] == "state"


def test_server_reads_the_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENENV_API_KEY", KEY)
    with run_server(keyed_app(Tracker())) as url:
        assert httpx.get(f"{url}/schema").status_code == 401


async def test_foreign_origin_cannot_open_sessions() -> None:
    tracker = Tracker()
    app = create_app(
        functools.partial(PingEnvironment, tracker),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=2),
        allowed_origins=("https://trusted.example",),
    )
    with run_server(app) as url:
        host = url.removeprefix("http://")
        with pytest.raises(InvalidStatus) as refused:
            async with connect(ws_url(url), origin="http://evil.example"):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 403
        assert b"origin http://evil.example may not open sessions" in refused.value.response.body
        for origin in (f"http://{host}", "https://trusted.example"):
            async with connect(ws_url(url), origin=origin) as ws:  # type: ignore[arg-type]
                await ws.send('{"type": "state"}')
                assert orjson.loads(await ws.recv())["type"] == "state"
    assert len(tracker.created) == 2


def test_a_foreign_page_cannot_act_over_http_either() -> None:
    tracker = Tracker()
    app = create_app(
        functools.partial(PingEnvironment, tracker),
        Ping,
        Pong,
        allowed_origins=("https://trusted.example",),
    )
    with run_server(app) as url, httpx.Client(base_url=url) as http:
        evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
        # A form or fetch() with a text/plain body: what a page may send any
        # origin without asking first (only the answer is kept from it).
        for path, body in (("/reset", b"{}"), ("/step", b'{"action": {}}'), ("/create", b"{}")):
            refused = http.post(path, content=body, headers=evil)
            assert refused.status_code == 403, path
            assert refused.json() == {"detail": "origin http://evil.example may not open sessions"}
        assert tracker.created == []
        assert http.get("/schema", headers=evil).status_code == 200  # reads stay open
        host = url.removeprefix("http://")
        for origin in (None, f"http://{host}", "https://trusted.example"):
            headers = {} if origin is None else {"Origin": origin}
            assert http.post("/reset", json={}, headers=headers).status_code == 200, origin
            stepped = http.post("/step", json={"action": {}}, headers=headers)
            assert stepped.json()["observation"]["count"] == 1, origin
    assert len(tracker.created) == 6


async def test_v2_clients_need_the_key_too(keyed_url: tuple[str, Tracker]) -> None:
    url, tracker = keyed_url
    with pytest.raises(AuthenticationError):
        await MuxClient(url).connect()
    with pytest.raises(AuthenticationError):
        await MuxClient(url, api_key="wrong").connect()
    async with MuxClient(url, api_key=KEY, action_cls=Ping, observation_cls=Pong) as mux:
        (session,) = await mux.open(1)
        assert (await session.step(Ping())).observation.count == 1
    await tracker.until_closed(1)  # only the keyed session was ever made


def test_the_remote_vector_env_needs_the_key() -> None:
    app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=4), api_key=KEY)
    with run_server(app) as url:
        with pytest.raises(AuthenticationError):
            RemoteVectorEnv(url, num_envs=2)
        envs = RemoteVectorEnv(url, num_envs=2, api_key=KEY)
        try:
            observations, _ = envs.reset(seed=0)
            assert observations.shape == (2, 4)
        finally:
            envs.close()


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_docs_page_passes_the_key_in_its_url_on(
    keyed_url: tuple[str, Tracker], page: str
) -> None:
    """A browser opens ``/docs?api_key=KEY``; the page then fetched ``/openapi.json``
    without the key (401), so it showed only an error."""
    url, _ = keyed_url
    with httpx.Client(base_url=url) as http:
        html = http.get(page, params={"api_key": KEY})
        assert html.status_code == 200
        (schema_url,) = re.findall(r"""['"]([^'"]*openapi\.json[^'"]*)['"]""", html.text)
        schema = http.get(schema_url)  # as the page fetches it: no header
        assert schema.status_code == 200
        assert "/reset" in schema.json()["paths"]
        assert http.get(page).status_code == 401
