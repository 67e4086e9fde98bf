"""What clients and logs see of a failure: no secrets on the wire, no API key in the logs."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest
from mcp import Client
from servers import Ping, PingEnvironment, Pong
from websockets.asyncio.client import connect

from openenv import (
    ConcurrencyConfig,
    EnvError,
    EnvExecutionError,
    State,
    WebSocketEnvClient,
    create_app,
    tool,
)
from openenv.client import ws_url
from openenv.testing import run_server

SECRET = "postgres://admin:hunter2-db-password@db.internal/prod"
KEY = "k3y-that-must-not-be-logged"


class Vault(PingEnvironment):
    """Fails with a secret in the message, or with a message meant for the client."""

    @tool
    def query(self) -> None:
        """Talk to the database."""
        raise ConnectionError(f"could not connect to {SECRET}")

    def step(self, action: Ping, **kwargs: Any) -> Pong:
        if action.message == "secret":
            raise RuntimeError(f"could not connect to {SECRET}")
        if action.message == "safe":
            raise EnvError("that move is not allowed here; try another")
        return super().step(action)

    @property
    def state(self) -> State:
        return State()


def vault_app(**settings: Any) -> Any:
    return create_app(Vault, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4), **settings)


def client(url: str) -> WebSocketEnvClient:
    return WebSocketEnvClient(url, action_cls=Ping, observation_cls=Pong)  # type: ignore[arg-type]


async def test_exception_text_stays_in_the_server_log(caplog: pytest.LogCaptureFixture) -> None:
    with run_server(vault_app(mcp=True)) as url:
        async with client(url) as env:
            await env.reset()
            with pytest.raises(EnvExecutionError) as failed:
                await env.step(Ping(message="secret"))
            assert failed.value.message.startswith("step() raised RuntimeError (")
            with pytest.raises(EnvExecutionError) as failed_tool:
                await env.call_tool("query")
            assert failed_tool.value.message.startswith("tool 'query' raised ConnectionError (")
            # An EnvError is the environment's message for the client: sent as is.
            with pytest.raises(EnvExecutionError) as refused:
                await env.step(Ping(message="safe"))
            assert refused.value.message == (
                "step() raised EnvError: that move is not allowed here; try another"
            )
            assert (await env.step(Ping(message="ok"))).observation.count == 1
        async with Client(f"{url}/mcp") as mcp:
            result = await mcp.call_tool("query", {})
            assert result.is_error
            mcp_text = result.content[0].text  # type: ignore[union-attr]
            assert mcp_text.startswith("[EXECUTION_ERROR] tool 'query' raised ConnectionError (")
    for text in (str(failed.value), str(failed_tool.value), mcp_text):
        assert "hunter2" not in text
    # The server log has the whole text and the traceback.
    logged = [r for r in caplog.records if r.name.startswith("openenv") and r.exc_info]
    assert any(SECRET in str(r.exc_info[1]) for r in logged if r.exc_info)  # type: ignore[index]
    assert "Traceback" in caplog.text
    assert SECRET in caplog.text


async def test_a_factory_failure_names_only_its_type() -> None:
    def broken() -> PingEnvironment:
        raise RuntimeError(f"could not connect to {SECRET}")

    with run_server(create_app(broken, Ping, Pong)) as url:
        async with connect(ws_url(url)) as ws:
            error = orjson.loads(await ws.recv())
    assert error["data"]["code"] == "FACTORY_ERROR"
    assert error["data"]["message"].startswith("could not create the environment: RuntimeError")
    assert "hunter2" not in error["data"]["message"]


async def test_error_details_sends_the_whole_text_when_asked() -> None:
    with run_server(vault_app(error_details=True)) as url:
        async with client(url) as env:
            await env.reset()
            with pytest.raises(EnvExecutionError, match="hunter2-db-password"):
                await env.step(Ping(message="secret"))


async def test_the_api_key_never_reaches_uvicorns_logs(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENENV_API_KEY", raising=False)
    app = create_app(PingEnvironment, Ping, Pong, api_key=KEY)
    # uvicorn's own logging set-up, at INFO: the access log and the handshake lines.
    with run_server(app, log_level="info", access_log=True) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/schema", params={"api_key": KEY, "x": "1"})).status_code == 200
            assert (await http.get("/web", params={"api_key": KEY})).status_code == 200
            wrong = await http.get("/metadata", params={"API_KEY": "wrong-" + KEY})
            assert wrong.status_code == 401
        async with connect(f"{ws_url(url)}?api_key={KEY}") as ws:
            await ws.send('{"type": "state"}')
            assert orjson.loads(await ws.recv())["type"] == "state"
    out, err = capfd.readouterr()
    logged = out + err
    assert "GET /schema?api_key=***&x=1 HTTP/1.1" in logged
    assert "GET /metadata?API_KEY=*** HTTP/1.1" in logged
    assert '"WebSocket /ws?api_key=***" [accepted]' in logged
    assert KEY not in logged
    logging.getLogger("uvicorn.access").info("%s", f"/x?api_key={KEY}")  # any later line too
    assert KEY not in "".join(capfd.readouterr())


async def test_a_key_whose_name_is_percent_encoded_is_not_taken_past_the_log_filter(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log filter knows ``api_key=`` as sent; a key under any other spelling of
    the name (``api%5Fkey``) would reach the access log whole, so it is no key."""
    monkeypatch.delenv("OPENENV_API_KEY", raising=False)
    app = create_app(PingEnvironment, Ping, Pong, api_key=KEY)
    with run_server(app, log_level="info", access_log=True) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            encoded = await http.get(f"{url}/schema?api%5Fkey={KEY}")
            assert encoded.status_code == 401
            # The value may be percent-encoded: the filter masks it whatever it holds.
            escaped = KEY.replace("-", "%2D")
            assert (await http.get(f"{url}/schema?api_key={escaped}")).status_code == 200
    assert KEY not in "".join(capfd.readouterr())


async def test_an_env_error_is_one_log_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Agents in training make the same mistake by the thousand: the log gets a
    # line for each, as for any client's mistake, and keeps tracebacks for bugs.
    with run_server(vault_app()) as url, caplog.at_level(logging.INFO, logger="openenv.server"):
        async with client(url) as env:
            await env.reset()
            for _ in range(2):
                with pytest.raises(EnvExecutionError):
                    await env.step(Ping(message="safe"))
            with pytest.raises(EnvExecutionError):
                await env.step(Ping(message="secret"))
    raised = [r for r in caplog.records if "step() raised" in r.getMessage()]
    said = [r for r in raised if "that move is not allowed" in r.getMessage()]
    assert [(r.levelno, r.exc_info) for r in said] == [(logging.INFO, None)] * 2
    bugs = [r for r in raised if r not in said]
    assert [r.levelno for r in bugs] == [logging.ERROR]
    assert bugs[0].exc_info is not None
    assert SECRET in str(bugs[0].exc_info[1])


class NotReady(Vault):
    """Says, as an ``EnvError``, why it cannot be made or list its tasks yet."""

    def __init__(self) -> None:
        raise EnvError("the dataset is still downloading; retry in a minute")

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[Any]:
        raise EnvError("the dataset is still downloading; retry in a minute")


async def test_an_env_error_from_a_factory_or_a_task_listing_is_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Steps and tools logged an ``EnvError`` as one INFO line, while the same
    error from the factory or a task listing was an ERROR with a traceback."""
    app = create_app(NotReady, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url, caplog.at_level(logging.INFO, logger="openenv.server"):
        async with httpx.AsyncClient(base_url=url) as http:
            listed = await http.get("/tasks", params={"split": "train"})
        async with connect(ws_url(url)) as ws:
            refused = orjson.loads(await ws.recv())
    assert listed.status_code == 500
    assert listed.json()["detail"].endswith(
        "EnvError: the dataset is still downloading; retry in a minute"
    )
    assert refused["data"]["code"] == "FACTORY_ERROR"
    said = [r for r in caplog.records if "the dataset is still downloading" in r.getMessage()]
    assert [(r.levelno, r.exc_info) for r in said] == [(logging.INFO, None)] * 2
    assert [r.getMessage().split(" raised ")[0] for r in said] == [
        "list_tasks('train')",
        "environment factory",
    ]
