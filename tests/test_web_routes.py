"""``/web`` and ``/web/ws`` over plain HTTP and WebSocket: what is served, and the shared cap."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from echo_env import EchoAction, EchoEnv
from echo_env.models import EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import CloseCode, ConcurrencyConfig, create_app
from openenv.client import ws_url
from openenv.server.webpage import ASSETS
from openenv.testing import run_server


@pytest.fixture(scope="module")
def two_slot_url() -> Iterator[str]:
    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=2)
    )
    with run_server(app) as url:
        yield url


def test_page_and_every_file_it_loads_are_served(echo_url: str) -> None:
    with httpx.Client(base_url=echo_url) as http:
        page = http.get("/web")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert "default-src 'none'" in page.headers["content-security-policy"]
        loaded = re.findall(r'(?:src|href)="web/([^"]+)"', page.text)
        assert sorted(loaded) == ["app.css", "app.js", "views.css"]
        scripts = {"app.js": http.get("/web/app.js").text}
        imported = re.findall(r'from "\./([^"]+)"', scripts["app.js"])
        assert sorted(imported) == [
            "apikey.js",
            "fetching.js",
            "form.js",
            "history.js",
            "metrics.js",
            "session.js",
            "tasks.js",
            "tools.js",
            "views.js",
        ]
        for name in [*loaded, *imported]:
            reply = http.get(f"/web/{name}")
            assert reply.status_code == 200, name
            assert reply.headers["content-type"] == ASSETS[name], name
            assert reply.headers["x-content-type-options"] == "nosniff"
        assert set(ASSETS) == {"index.html", *loaded, *imported}  # nothing unused is shipped


def test_page_is_self_contained(echo_url: str) -> None:
    # No CDN, no web fonts, no absolute URLs: everything comes from the server itself.
    for name in ASSETS:
        text = httpx.get(
            f"{echo_url}/web/{name}" if name != "index.html" else f"{echo_url}/web"
        ).text
        assert not re.search(r"https?://|//cdn|@import|url\(", text), name


@pytest.mark.parametrize("path", ["/web/index.html", "/web/missing.js", "/web/..%2fapp.py"])
def test_only_the_page_files_are_served(echo_url: str, path: str) -> None:
    assert httpx.get(f"{echo_url}{path}").status_code == 404


def test_trailing_slash_redirects_to_the_page(echo_url: str) -> None:
    reply = httpx.get(f"{echo_url}/web/", follow_redirects=True)
    assert reply.status_code == 200
    assert reply.url.path == "/web"


async def test_web_false_serves_no_page_and_no_web_socket() -> None:
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, web=False)
    with run_server(app) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/web")).status_code == 404
            assert (await http.get("/web/app.js")).status_code == 404
            assert (await http.get("/health")).status_code == 200
        with pytest.raises(InvalidStatus):
            async with connect(ws_url(url, "/web/ws")):
                pass
        async with EchoEnv(url) as env:  # /ws is untouched
            await env.reset()
            assert (await env.step(EchoAction(message="hi"))).observation.echoed_message == "hi"


async def test_web_socket_speaks_the_same_protocol(echo_url: str) -> None:
    async with EchoEnv(ws_url(echo_url, "/web/ws")) as env:
        await env.reset(seed=1, episode_id="web")
        result = await env.step(EchoAction(message="abcd"))
        state = await env.state()
    assert (result.observation.echoed_message, result.reward) == ("abcd", 0.4)
    assert (state.episode_id, state.step_count) == ("web", 1)

    async with connect(ws_url(echo_url, "/web/ws")) as ws:
        await ws.send(orjson.dumps({"type": "step", "data": {"message": 3}, "id": "a"}).decode())
        reply = orjson.loads(await ws.recv())
    assert reply["id"] == "a"
    assert reply["data"]["code"] == "VALIDATION_ERROR"
    assert reply["data"]["errors"][0]["loc"] == ["message"]  # what the page highlights


async def test_web_sessions_count_against_the_same_cap(two_slot_url: str) -> None:
    async with EchoEnv(two_slot_url) as on_ws, EchoEnv(ws_url(two_slot_url, "/web/ws")) as on_web:
        await on_ws.reset()
        await on_web.reset()
        async with httpx.AsyncClient() as http:
            health = (await http.get(f"{two_slot_url}/health")).json()
        assert (health["active_sessions"], health["max_sessions"]) == (2, 2)
        for path in ("/web/ws", "/ws"):
            async with connect(ws_url(two_slot_url, path)) as refused:
                error = orjson.loads(await refused.recv())
                with pytest.raises(ConnectionClosed):
                    await refused.recv()
            assert error["data"]["code"] == "CAPACITY_REACHED"
            assert (error["data"]["active_sessions"], error["data"]["max_sessions"]) == (2, 2)
            assert refused.close_code == CloseCode.TRY_AGAIN_LATER
    # Both slots come back once their sessions close. The server frees a slot
    # just after the close handshake, so poll for it (with a deadline).
    deadline = time.monotonic() + 10
    async with httpx.AsyncClient() as http:
        while (await http.get(f"{two_slot_url}/health")).json()["active_sessions"]:
            assert time.monotonic() < deadline, "closed sessions kept their slots"
            await asyncio.sleep(0.01)
    async with EchoEnv(ws_url(two_slot_url, "/web/ws")) as one, EchoEnv(two_slot_url) as two:
        await asyncio.gather(one.reset(), two.reset())
