"""What ``create_app`` checks at startup, and its HTTP introspection routes."""

from __future__ import annotations

import functools
import re
from typing import Any

import httpx
import pytest
from servers import Ping, PingEnvironment, PingState, Pong

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import (
    ConcurrencyConfig,
    ConcurrencyConfigurationError,
    Environment,
    EnvironmentMetadata,
    State,
    WebSocketEnvClient,
    create_app,
)
from openenv.testing import run_server


class Unsafe(Environment[Ping, Pong, State]):
    """Shares a global; not safe to run twice in one process."""


def make_unsafe() -> Unsafe:
    return Unsafe()


def make_safe() -> PingEnvironment:
    return PingEnvironment()


def make_unknown():  # type: ignore[no-untyped-def]
    return PingEnvironment()


MANY = ConcurrencyConfig(max_concurrent_envs=8)


@pytest.mark.parametrize(
    "factory",
    [Unsafe, functools.partial(Unsafe), functools.partial(functools.partial(Unsafe)), make_unsafe],
    ids=["class", "partial", "nested-partial", "function"],
)
def test_unsafe_environment_refused_with_many_sessions(factory: object) -> None:
    with pytest.raises(ConcurrencyConfigurationError, match="SUPPORTS_CONCURRENT_SESSIONS = True"):
        create_app(factory, Ping, Pong, MANY)


def test_unsafe_environment_allowed_with_one_session() -> None:
    assert create_app(Unsafe, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=1))


@pytest.mark.parametrize(
    "factory",
    [PingEnvironment, functools.partial(PingEnvironment, None), make_safe],
    ids=["class", "partial", "function"],
)
def test_safe_environment_accepted_with_many_sessions(factory: object) -> None:
    assert create_app(factory, Ping, Pong, MANY)


def test_factory_of_unknown_class_must_be_annotated() -> None:
    with pytest.raises(ConcurrencyConfigurationError, match="Annotate its return type"):
        create_app(make_unknown, Ping, Pong, MANY)
    make_unknown.SUPPORTS_CONCURRENT_SESSIONS = True  # type: ignore[attr-defined]
    try:
        assert create_app(make_unknown, Ping, Pong, MANY)
    finally:
        del make_unknown.SUPPORTS_CONCURRENT_SESSIONS  # type: ignore[attr-defined]


def test_instance_instead_of_factory_says_what_to_pass() -> None:
    with pytest.raises(TypeError, match=r"Pass the class \(PingEnvironment\)"):
        create_app(PingEnvironment(), Ping, Pong)
    with pytest.raises(TypeError, match="zero-argument callable"):
        create_app(42, Ping, Pong)


@pytest.mark.parametrize(
    "values",
    [{"max_concurrent_envs": 0}, {"max_concurrent_envs": -3}, {"session_timeout": 0}],
)
def test_concurrency_config_rejects_nonsense(values: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="greater than"):
        ConcurrencyConfig(**values)


def test_unknown_setting_is_an_error() -> None:
    with pytest.raises(ValueError, match="max_thread"):
        create_app(PingEnvironment, Ping, Pong, max_thread=3)


def test_concurrency_config_from_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENENV_MAX_CONCURRENT_ENVS", "12")
    monkeypatch.setenv("OPENENV_SESSION_TIMEOUT", "30")
    config = ConcurrencyConfig.from_env(max_concurrent_envs=64)
    assert (config.max_concurrent_envs, config.session_timeout) == (12, 30.0)
    monkeypatch.delenv("OPENENV_MAX_CONCURRENT_ENVS")
    assert ConcurrencyConfig.from_env(max_concurrent_envs=64).max_concurrent_envs == 64


def test_health_metadata_and_schema(echo_url: str) -> None:
    with httpx.Client(base_url=echo_url) as http:
        health = http.get("/health").json()
        metadata = http.get("/metadata").json()
        schema = http.get("/schema").json()
    assert health == {
        "status": "healthy",
        "active_sessions": 0,
        "max_sessions": 64,
        "queued_sessions": 0,
        "protocol_version": 1,
        "workers": 1,
    }
    assert metadata["name"] == "EchoEnvironment"
    assert metadata["description"].startswith("Echoes every message back")
    assert metadata["supports_concurrent_sessions"] is True
    assert schema["action"] == EchoAction.model_json_schema()
    assert schema["observation"] == EchoObservation.model_json_schema()
    assert schema["state"]["properties"].keys() >= {"episode_id", "step_count"}
    assert schema["action"]["required"] == ["message"]


@pytest.mark.parametrize(
    "path", ["/health", "/metadata", "/schema", "/metrics", "/tools", "/splits"]
)
def test_introspection_routes_answer_head_as_their_get(echo_url: str, path: str) -> None:
    # Uptime monitors ask with HEAD, and take a 405 for a server that is down.
    with httpx.Client(base_url=echo_url) as http:
        head, get = http.head(path), http.get(path)
        paths = http.get("/openapi.json").json()["paths"]
    assert (head.status_code, get.status_code) == (200, 200)
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert list(paths[path]) == ["get"]  # the OpenAPI page lists each route once


def test_state_schema_comes_from_the_generic_arguments() -> None:
    app = create_app(PingEnvironment, Ping, Pong)
    with run_server(app) as url:
        schema = httpx.get(f"{url}/schema").json()
    assert schema["state"] == PingState.model_json_schema()


def test_explicit_metadata_is_served() -> None:
    meta = EnvironmentMetadata(name="custom", description="A custom description.", version="2")
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, metadata=meta)
    with run_server(app) as url:
        assert httpx.get(f"{url}/metadata").json()["version"] == "2"


def test_no_episode_carries_between_http_calls(echo_url: str) -> None:
    # Episodes run over WebSocket only: OpenEnv's HTTP calls (docs/compat.md)
    # each get a fresh environment, so a step over HTTP is always a first step.
    for _ in range(3):
        stepped = httpx.post(f"{echo_url}/step", json={"action": {"message": "x"}})
        assert stepped.json()["observation"]["echoed_message"] == "x"
        assert httpx.get(f"{echo_url}/state").json()["step_count"] == 0
    assert httpx.get(f"{echo_url}/health").json()["active_sessions"] == 0
    assert httpx.get(f"{echo_url}/step").status_code == 405


@pytest.mark.parametrize("path", ["/ws", "/web/ws"])
def test_a_middleware_the_user_adds_sees_the_session_sockets(path: str) -> None:
    # Session sockets skip FastAPI's middleware stack only while it holds
    # nothing but openenv's own guard; a user's middleware must still see them.
    seen: list[tuple[str, str]] = []

    class Spy:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            seen.append((scope["type"], scope.get("path", "")))
            await self.app(scope, receive, send)

    app = create_app(EchoEnvironment, EchoAction, EchoObservation)
    app.add_middleware(Spy)
    with run_server(app) as url:
        client = WebSocketEnvClient(
            url.replace("http", "ws") + path,
            action_cls=EchoAction,
            observation_cls=EchoObservation,
        )
        with client.sync() as env:
            assert env.step(EchoAction(message="hi")).observation.echoed_message == "hi"
    assert ("websocket", path) in seen


class Undocumented(EchoEnvironment):
    pass


def test_metadata_never_shows_the_base_classs_docstring() -> None:
    app = create_app(Undocumented, EchoAction, EchoObservation)
    with run_server(app) as url:
        metadata = httpx.get(f"{url}/metadata").json()
    assert metadata["name"] == "Undocumented"
    assert metadata["description"] == ""


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("OPENENV_MAX_CONCURRENT_ENVS", "abc"),
        ("OPENENV_MAX_CONCURRENT_ENVS", "0"),
        ("OPENENV_SESSION_TIMEOUT", "never"),
        ("OPENENV_QUEUE_TIMEOUT", "-1"),
    ],
)
def test_a_bad_environment_variable_is_named_in_the_error(
    monkeypatch: pytest.MonkeyPatch, var: str, raw: str
) -> None:
    # A deployment sets the variable, never the field: pydantic's message named only
    # the field (`session_timeout: Input should be a valid number`).
    monkeypatch.setenv(var, raw)
    with pytest.raises(ValueError, match=rf"^{var} must be .+, not '{raw}'$"):
        ConcurrencyConfig.from_env(max_concurrent_envs=64)


def test_openenvs_cap_variable_is_named_when_it_is_not_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from openenv.core.env_server.http_server import create_app as openenv_create_app

    monkeypatch.setenv("MAX_CONCURRENT_ENVS", "eight")
    with pytest.raises(ValueError, match=r"^MAX_CONCURRENT_ENVS must be .+, not 'eight'$"):
        openenv_create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo")
    monkeypatch.setenv("MAX_CONCURRENT_ENVS", "3")
    app = openenv_create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo")
    assert app.state.openenv.concurrency.max_concurrent_envs == 3


@pytest.mark.parametrize("raw", ["0", "-3"])
def test_openenvs_cap_variable_is_named_when_it_is_below_one(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    # pydantic's message named the field (max_concurrent_envs), never set by anyone.
    from openenv.core.env_server.http_server import create_app as openenv_create_app

    monkeypatch.setenv("MAX_CONCURRENT_ENVS", raw)
    with pytest.raises(ValueError, match=rf"^MAX_CONCURRENT_ENVS must be .+, not '{raw}'$"):
        openenv_create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo")


@pytest.mark.parametrize(
    ("var", "raw", "said"),
    [
        ("OPENENV_API_KEY", " key with spaces around ", "$OPENENV_API_KEY must be printable"),
        ("OPENENV_API_KEY", "clé", "$OPENENV_API_KEY must be printable"),
        ("OPENENV_RECORD", __file__, f"$OPENENV_RECORD={__file__} is a file"),
    ],
)
def test_a_bad_server_setting_variable_is_named_in_the_error(
    monkeypatch: pytest.MonkeyPatch, var: str, raw: str, said: str
) -> None:
    monkeypatch.setenv(var, raw)
    with pytest.raises(ValueError, match=re.escape(said)) as raised:
        create_app(EchoEnvironment, EchoAction, EchoObservation)
    assert "key with spaces" not in str(raised.value)  # a key, even a bad one, is a secret
