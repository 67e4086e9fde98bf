"""OpenEnv's tool-calling environments (``MCPEnvironment`` on FastMCP), served by openenv.

``tests/apps/oe_mcp_echo`` is OpenEnv's ``envs/echo_env``, byte for byte: a
``fastmcp.FastMCP`` server handed to ``MCPEnvironment``, served by
``create_app(EchoEnvironment, CallToolAction, CallToolObservation, ...)``, and
its client, an ``MCPToolClient``. Played over ``/ws`` with OpenEnv's actions
through ``step``, with the tool client, and with OpenEnv 0.10's own client.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from peer_venvs import APPS, run_peer_script
from peer_venvs import peer_python as peer_venv

from openenv.core import GenericEnvClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    ToolErrorType,
)
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.mcp_client import MCPToolClient
from openenv.testing import run_server

sys.path.insert(0, str(APPS))

from oe_mcp_echo import EchoEnv
from oe_mcp_echo.server.app import app as echo_app


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with run_server(echo_app) as url:
        yield url


def test_list_and_call_tools_through_step_over_ws(echo_url: str) -> None:
    with MCPToolClient(base_url=echo_url) as env:
        env.reset()
        listed = env.step(ListToolsAction()).observation
        assert isinstance(listed, ListToolsObservation)
        assert [t.name for t in listed.tools] == ["echo_message", "echo_with_length"]
        assert listed.tools[0].input_schema["required"] == ["message"]
        assert listed.tools[0].description.startswith("Echo back the provided message.")
        called = env.step(
            CallToolAction(tool_name="echo_with_length", arguments={"message": "hey"})
        )
        assert isinstance(called.observation, CallToolObservation)
        assert called.observation.error is None
        assert called.observation.result["data"] == {"message": "hey", "length": 3}
        missing = env.step(CallToolAction(tool_name="nope"))
        assert missing.observation.error.error_type == ToolErrorType.TOOL_NOT_FOUND
        assert env.state().step_count == 3  # the environment's own step() counted them


def test_openenv_echo_client_lists_and_calls_its_tools(echo_url: str) -> None:
    with EchoEnv(base_url=echo_url) as env:
        env.reset()
        assert [t.name for t in env.list_tools()] == ["echo_message", "echo_with_length"]
        assert env.call_tool("echo_message", message="Hello!") == "Hello!"
        assert env.call_tool("echo_with_length", message="Test") == {"message": "Test", "length": 4}
        with pytest.raises(RuntimeError, match="invalid_args"):
            env.call_tool("echo_message", message="hi", extra=1)
    # Called first, without list_tools: found through step all the same.
    with EchoEnv(base_url=echo_url) as env:
        assert env.call_tool("echo_message", message="first") == "first"


def test_plain_dict_actions_reach_the_tools(echo_url: str) -> None:
    with GenericEnvClient(base_url=echo_url) as env:
        env.reset()
        result = env.step(
            {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "d"}}
        )
        assert result.observation["result"]["data"] == "d"
        assert [t["name"] for t in env.step({"type": "list_tools"}).observation["tools"]] == [
            "echo_message",
            "echo_with_length",
        ]


class Counter(MCPEnvironment):
    """Tools on FastMCP beside an action of its own, handled by ``_step_impl``."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        from fastmcp import FastMCP

        mcp = FastMCP("counter")
        self.count = 0

        @mcp.tool
        def read() -> int:
            """The count."""
            return self.count

        @mcp.tool
        async def bump(by: int) -> int:
            self.count += by
            return self.count

        @mcp.tool
        def fail() -> str:
            raise ValueError("it broke")

        super().__init__(mcp)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kw: Any
    ) -> Observation:
        self.count = 0
        return Observation()

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kw: Any) -> Observation:
        self.count += action.metadata.get("push", 0)
        return Observation(reward=float(self.count), metadata={"kind": type(action).__name__})

    @property
    def state(self) -> State:
        return State(step_count=self.count)


def test_other_actions_go_to_step_impl_and_tools_share_the_environment() -> None:
    app = create_app(Counter, Action, Observation, max_concurrent_envs=2)
    with run_server(app) as url, MCPToolClient(base_url=url) as env:
        env.reset()
        assert env.call_tool("bump", by=5) == 5
        pushed = env.step(Action(metadata={"push": 2}))
        assert pushed.reward == 7.0
        assert pushed.observation.metadata == {"kind": "Action"}
        assert env.call_tool("read") == 7
        with pytest.raises(RuntimeError, match="it broke"):
            env.call_tool("fail")
        env.reset()
        assert env.call_tool("read") == 0


def test_a_tool_with_a_reserved_name_is_refused() -> None:
    from fastmcp import FastMCP

    mcp = FastMCP("bad")

    @mcp.tool
    def reset() -> str:
        return "no"

    class Bad(Counter):
        def __init__(self) -> None:
            MCPEnvironment.__init__(self, mcp)

    with pytest.raises(ValueError, match=r"reserved names: \['reset'\]"):
        Bad()


def test_without_fastmcp_making_one_says_what_to_install() -> None:
    # fastmcp made unimportable in a fresh interpreter (None in sys.modules).
    code = (
        "import sys; sys.modules['fastmcp'] = None\n"
        "from openenv.core.env_server.mcp_environment import MCPEnvironment\n"
        "class E(MCPEnvironment):\n"
        "    def reset(self, **kw): ...\n"
        "    def _step_impl(self, action, **kw): ...\n"
        "    state = None\n"
        "try:\n"
        "    E(object())\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install fastmcp" in done.stdout


@pytest.fixture(scope="module")
def peer_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OpenEnv's client: make's ``.venv-openenv-peer``, else a fresh venv."""
    return peer_venv(tmp_path_factory, APPS / "openenv_peer_requirements.txt", ".venv-openenv-peer")


@pytest.mark.timeout(300)
def test_openenv_010_client_plays_the_mcp_echo_environment(
    echo_url: str, peer_python: Path
) -> None:
    report = run_peer_script(peer_python, APPS / "openenv_peer_mcp_client.py", echo_url)
    assert report["observation_types"] == ["CallToolObservation", "CallToolObservation"]
    assert report["tools"] == ["echo_message", "echo_with_length"]
    assert report["echoed"] == "hi"
    assert report["sized"] == {"message": "abc", "length": 3}
    assert report["missing"] == "tool_not_found"
    assert report["steps"] == 4
