"""OpenEnv 0.10 environments and clients, unchanged, on openenv.

``tests/apps/oe_echo`` is what OpenEnv's ``openenv init oe_echo`` writes,
byte for byte: ``openenv.core.*`` imports, ``create_app(..., env_name=...,
max_concurrent_envs=1)``, a client with ``_step_payload``/``_parse_result``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from echo_env.models import EchoAction
from openenv import CapacityError, SessionClosedError, WebSocketEnvClient
from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.http_server import create_app as core_create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.testing import run_server

sys.path.insert(0, str(Path(__file__).parent / "apps"))

from oe_echo import OeEchoAction, OeEchoEnv, OeEchoObservation
from oe_echo.server.app import app as oe_echo_app
from oe_echo.server.oe_echo_environment import OeEchoEnvironment


@pytest.fixture(scope="module")
def oe_echo_url() -> Iterator[str]:
    with run_server(oe_echo_app) as url:
        yield url


@pytest.fixture(scope="module")
def counter_url() -> Iterator[str]:
    from counter_env.server.app import app

    with run_server(app) as url:
        yield url


def test_the_template_app_is_served_with_its_name_and_cap() -> None:
    service = oe_echo_app.state.openenv
    assert service.metadata.name == "oe_echo"
    assert service.concurrency.max_concurrent_envs == 1


def test_the_template_client_plays_an_episode_the_documented_way(oe_echo_url: str) -> None:
    # The template client's own docstring: `with Env(base_url=...).sync() as client`.
    with OeEchoEnv(base_url=oe_echo_url).sync() as client:
        result = client.reset()
        assert result.observation.echoed_message == "Oe Echo environment ready!"
        result = client.step(OeEchoAction(message="Hello!"))
        assert result.observation.echoed_message == "Hello!"
        assert result.observation.message_length == 6
        assert result.reward == pytest.approx(0.6)
        # `_parse_result` is the template's: it reads the reply's metadata.
        assert result.metadata == {"original_message": "Hello!", "step": 1}
        assert client.state().step_count == 1


def test_the_template_client_without_sync_blocks_outside_an_event_loop(oe_echo_url: str) -> None:
    client = OeEchoEnv(base_url=oe_echo_url)
    try:
        assert client.reset().observation.echoed_message == "Oe Echo environment ready!"
        result = client.step(OeEchoAction(message="hey"))
        assert isinstance(result.observation, OeEchoObservation)
        assert result.observation.echoed_message == "hey"
    finally:
        client.close()


async def test_the_template_client_awaited_inside_an_event_loop(oe_echo_url: str) -> None:
    async with OeEchoEnv(base_url=oe_echo_url) as client:
        await client.reset()
        result = await client.step(OeEchoAction(message="async"))
        assert result.observation.echoed_message == "async"


class _SendsNoMessage(OeEchoEnv):
    def _step_payload(self, action: OeEchoAction) -> dict[str, Any]:
        return {"message": None}


def test_errors_are_the_builtin_exceptions_openenv_clients_catch(oe_echo_url: str) -> None:
    # OpenEnv 0.10's client raises RuntimeError for a server's error frame and
    # ConnectionError when it cannot connect; code written against it catches those.
    client = _SendsNoMessage(base_url=oe_echo_url)
    try:
        client.reset()
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step(OeEchoAction(message="hi"))
        # The session goes on after the error, as on OpenEnv.
        assert client.state().step_count == 0
    finally:
        client.close()
    with socket.socket() as unused:  # bound, never listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        with pytest.raises(ConnectionError):
            OeEchoEnv(base_url=f"http://127.0.0.1:{port}").reset()


async def test_max_concurrent_envs_is_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    from openenv.core.env_server.http_server import create_app

    monkeypatch.setenv("OPENENV_QUEUE_TIMEOUT", "0")  # refuse at once instead of queueing
    app = create_app(
        OeEchoEnvironment,
        OeEchoAction,
        OeEchoObservation,
        env_name="oe_echo",
        max_concurrent_envs=2,
    )
    with run_server(app) as url:
        first, second, third = (WebSocketEnvClient(url) for _ in range(3))
        await asyncio.gather(first.reset(), second.reset())
        with pytest.raises(CapacityError):
            await third.reset()
        await asyncio.gather(first.close(), second.close(), third.close())


def test_our_create_app_takes_openenvs_keywords_too() -> None:
    # A user who moved the imports to `openenv` keeps the call as it was.
    from openenv import create_app

    app = create_app(
        OeEchoEnvironment, OeEchoAction, OeEchoObservation, env_name="moved", max_concurrent_envs=3
    )
    with run_server(app) as url:
        assert httpx.get(f"{url}/metadata").json()["name"] == "moved"
        assert httpx.get(f"{url}/health").json()["max_sessions"] == 3


def test_openenv_clients_send_action_metadata(echo_url: str) -> None:
    # OpenEnv's generic clients send `action.model_dump()`, metadata included.
    payload = EchoAction(message="hi", metadata={"turn": 1}).model_dump()
    assert payload == {"message": "hi", "metadata": {"turn": 1}}
    with WebSocketEnvClient(echo_url).sync() as env:
        env.reset()
        assert env.step(payload).observation.model_extra == {
            "echoed_message": "hi",
            "message_length": 2,
        }


def test_openenv_core_import_paths() -> None:
    from openenv import Action, Environment, Observation, State, StepResult
    from openenv.core import EnvClient
    from openenv.core import Environment as TopEnvironment
    from openenv.core.client_types import StepResult as CoreStepResult
    from openenv.core.env_client import EnvClient as CoreEnvClient
    from openenv.core.env_server import Action as ServerAction
    from openenv.core.env_server import create_app
    from openenv.core.env_server.http_server import create_app as http_create_app
    from openenv.core.env_server.interfaces import Environment as CoreEnvironment
    from openenv.core.env_server.types import Observation as CoreObservation
    from openenv.core.env_server.types import State as CoreState

    # OpenEnv's models are openenv's, with OpenEnv's model settings.
    assert issubclass(ServerAction, Action)
    assert issubclass(CoreObservation, Observation)
    assert issubclass(CoreState, State)
    # OpenEnv's Environment is openenv's, plus what OpenEnv's server does with it.
    assert issubclass(CoreEnvironment, Environment)
    assert TopEnvironment is CoreEnvironment
    assert EnvClient is CoreEnvClient
    assert issubclass(CoreStepResult, StepResult)
    assert create_app is http_create_app


def test_openenvs_tool_client_calls_our_tools(counter_url: str) -> None:
    from openenv.core.mcp_client import MCPToolClient

    with MCPToolClient(base_url=counter_url) as env:
        env.reset()
        assert {"increment", "get_value", "submit"} <= {tool.name for tool in env.list_tools()}
        increment = next(tool for tool in env.list_tools() if tool.name == "increment")
        assert "amount" in increment.input_schema["properties"]
        assert env.call_tool("increment", amount=2) == {"value": 2}
        assert env.call_tool("get_value") == 2


def test_openenvs_sync_wrapper_drives_the_tool_client_and_a_clients_own_methods(
    counter_url: str,
) -> None:
    from openenv.core.mcp_client import MCPToolClient
    from openenv.core.sync_client import SyncEnvClient

    class Counter(MCPToolClient):
        async def bump_twice(self, amount: int) -> Any:  # a client's own async method
            await self.call_tool("increment", amount=amount)
            return await self.call_tool("increment", amount=amount)

    # OpenEnv's wrapper, `.sync()`: its tools by keyword, the client's own async
    # methods blocking, the client itself as `async_client`.
    with Counter(base_url=counter_url).sync() as env:
        assert isinstance(env, SyncEnvClient)
        assert isinstance(env.async_client, Counter)
        env.reset()
        assert env.call_tool("increment", amount=2) == {"value": 2}
        assert env.bump_twice(1) == {"value": 4}
        assert env.call_tool("get_value") == 4
        assert "increment" in {tool.name for tool in env.list_tools()}
        with pytest.raises(AttributeError, match="no_such_method"):
            env.no_such_method()


async def test_openenvs_tool_client_awaited(counter_url: str) -> None:
    from openenv.core.mcp_client import MCPToolClient

    async with MCPToolClient(base_url=counter_url) as env:
        await env.reset()
        assert await env.call_tool("increment", amount=3) == {"value": 3}


class _Act(Action):
    n: int = 1


class _Seen(Observation):
    via: str = ""
    loop_running: bool = False


class _AsyncStepping(Environment[_Act, _Seen, State]):
    """Written as for OpenEnv: a sync ``step`` and the ``step_async`` its server awaits."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> _Seen:
        self._state = State(episode_id=episode_id)
        return _Seen(via=f"reset seed={seed}")

    def step(self, action: _Act, timeout_s: float | None = None, **kwargs: Any) -> _Seen:
        return _Seen(via="step")

    async def step_async(
        self, action: _Act, timeout_s: float | None = None, **kwargs: Any
    ) -> _Seen:
        self._state.step_count += 1
        return _Seen(via="step_async", loop_running=_loop_running(), reward=float(action.n))

    @property
    def state(self) -> State:
        return self._state


class _AsyncResetting(_AsyncStepping):
    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> _Seen:
        return _Seen(via=f"reset_async {sorted(kwargs)}", loop_running=_loop_running())


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Client(EnvClient[_Act, _Seen, State]):
    def _step_payload(self, action: _Act) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[_Seen]:
        observation = _Seen(**payload["observation"], reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"), done=False)

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


def test_an_openenv_environment_is_run_as_openenvs_server_runs_it() -> None:
    # OpenEnv's server awaits reset_async/step_async where a class overrides them,
    # and drops reset arguments the method does not take.
    app = core_create_app(_AsyncStepping, _Act, _Seen, env_name="steps", max_concurrent_envs=2)
    with run_server(app) as url, _Client(base_url=url) as env:
        first = env.reset(seed=3, difficulty="hard")
        assert first.observation.via == "reset seed=3"
        result = env.step(_Act(n=2))
        assert (result.observation.via, result.observation.loop_running) == ("step_async", True)
        assert result.reward == 2.0
        assert env.state().step_count == 1
    app = core_create_app(_AsyncResetting, _Act, _Seen, env_name="resets", max_concurrent_envs=2)
    with run_server(app) as url, _Client(base_url=url) as env:
        reset = env.reset(seed=1, difficulty="hard").observation
        assert (reset.via, reset.loop_running) == ("reset_async ['difficulty']", True)
        assert env.step(_Act()).observation.via == "step_async"


class _GenericStyle(OeEchoEnv):
    # As OpenEnv's GenericEnvClient: the observation stays a dict, and its
    # StepResult (a dataclass there) is built positionally.
    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Any]:
        return StepResult(payload.get("observation", {}), payload.get("reward"), payload["done"])


def test_a_step_result_is_built_as_openenvs_dataclass_is(oe_echo_url: str) -> None:
    with _GenericStyle(base_url=oe_echo_url) as env:
        env.reset()
        result = env.step(OeEchoAction(message="hey"))
    # OpenEnv's server leaves the metadata among the observation's fields.
    assert result.observation == {
        "echoed_message": "hey",
        "message_length": 3,
        "metadata": {"original_message": "hey", "step": 1},
    }
    assert (result.reward, result.done) == (pytest.approx(0.3), False)


def test_disconnect_ends_the_session_and_the_next_call_opens_another(oe_echo_url: str) -> None:
    # OpenEnv's EnvClient.disconnect() closes the socket; its next call reconnects.
    client = OeEchoEnv(base_url=oe_echo_url)
    try:
        client.reset()
        client.step(OeEchoAction(message="one"), timeout_s=5)  # OpenEnv ignores keywords
        assert client.state().step_count == 1
        client.disconnect()
        # The cap is 1: the old session's slot is free, or this would wait and fail.
        assert httpx.get(f"{oe_echo_url}/health").json()["active_sessions"] == 0
        client.reset()
        assert client.state().step_count == 0  # a new session, a new environment
        client.disconnect()
        client.disconnect()  # as often as asked
    finally:
        client.close()
    with pytest.raises(SessionClosedError):  # closed for good
        client.reset()


async def test_disconnect_awaited_inside_an_event_loop(oe_echo_url: str) -> None:
    client = OeEchoEnv(base_url=oe_echo_url)
    try:
        await client.reset()
        await client.disconnect()
        result = await client.step(OeEchoAction(message="again"))
        assert result.observation.echoed_message == "again"
    finally:
        await client.close()
