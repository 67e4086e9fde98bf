"""OpenEnv 0.10's real client, in a virtual environment of its own, against our server.

PyPI's ``openenv`` (Hugging Face's OpenEnv) imports as ``openenv`` too, so it
lives in a venv of its own (``tests/peer_venvs.py``: make's
``.venv-openenv-peer``, else one made by this test), and
``tests/apps/openenv_peer_client.py`` runs there (and
``openenv_peer_mcp_production.py``, its ``MCPToolClient``, which speaks only
OpenEnv's own ``/mcp`` session protocol: see docs/compat.md).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from peer_venvs import APPS, run_peer_script
from peer_venvs import peer_python as peer_venv
from test_mcp import until_active
from tool_envs import HTTP

from counter_env.client import CounterEnv
from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, create_app
from openenv.testing import run_server

SCRIPT = APPS / "openenv_peer_client.py"
MCP_SCRIPT = APPS / "openenv_peer_mcp_production.py"
EPISODES = 100
# A fresh venv with OpenEnv 0.10 (gradio, huggingface_hub, fastmcp, ...) takes 0.5-2 min.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def peer_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OpenEnv's client: make's ``.venv-openenv-peer``, else a fresh venv."""
    return peer_venv(tmp_path_factory, APPS / "openenv_peer_requirements.txt", ".venv-openenv-peer")


class NotingEcho(EchoEnvironment):
    """Echo, with the observation's ``metadata`` filled in."""

    def step(self, action: EchoAction, **kwargs: Any) -> EchoObservation:
        observation = super().step(action)
        observation.metadata = {"length": len(action.message)}
        return observation


def test_openenv_010_client_plays_100_concurrent_episodes(peer_python: Path) -> None:
    app = create_app(
        NotingEcho, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=128)
    )
    with run_server(app) as url:
        report = run_peer_script(peer_python, SCRIPT, url, str(EPISODES))
    assert len(report["episodes"]) == EPISODES
    for episode in report["episodes"]:
        assert episode["steps"] == 3
        assert episode["rewards"] == pytest.approx([len(episode["message"]) / 10] * 3)
    assert report["sync_reward"] == pytest.approx(0.4)
    assert report["plain_reward"] == pytest.approx(0.6)
    # OpenEnv's server leaves metadata among the fields, where its clients read it;
    # openenv's /ws sent it only beside them, so such a client saw {}.
    assert report["plain_metadata"] == {"length": 6}


def counter_app(cap: int, session_timeout: float | None = None) -> Any:
    return create_app(
        CounterEnvironment,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=cap, session_timeout=session_timeout),
        mcp=True,
        mcp_sessions_per_client=cap,
    )


def test_openenv_010_mcp_tool_client_plays_tools_and_steps_on_one_environment(
    peer_python: Path,
) -> None:
    # OpenEnv's MCPToolClient has only its production mode: OpenEnv's own /mcp
    # session methods (openenv/session/create, then session_id in each call's
    # params, and /ws?session_id= for reset and step). openenv's /mcp answered
    # them with a -32601 refusal: the client could list no tool and call none.
    with run_server(counter_app(2)) as url:
        report = run_peer_script(peer_python, MCP_SCRIPT, url, "play")
        assert HTTP.get(f"{url}/health").json()["active_sessions"] == 0
        # The standard MCP surface is untouched beside it.
        listed = asyncio.run(mcp_tool_names(f"{url}/mcp"))
    assert listed == ["increment", "get_value", "submit"]
    assert report["tools"] == ["increment", "get_value", "submit"]
    assert report["increment_schema"]["required"] == ["amount"]
    assert report["connected_active"] == 1  # async with: one session, its WebSocket attached
    # The tools over HTTP and the steps over /ws share one counter.
    assert report["reset_value"] == 0
    assert report["called"] == {"value": 2}
    assert report["stepped_value"] == 5
    assert report["got_value"] == 5
    assert report["state_steps"] == 2
    assert report["unknown_tool"]["type"] == "RuntimeError"
    assert report["unknown_tool"]["message"].startswith(
        "Tool 'decrement' failed: [UNKNOWN_TOOL] unknown tool 'decrement'"
    )
    assert report["bad_arguments"]["message"].startswith(
        "Tool 'increment' failed: [VALIDATION_ERROR] invalid arguments for tool 'increment': "
        "amount: Input should be a valid integer"
    )
    assert report["after_errors"] == 5  # the session goes on after its mistakes
    # close() frees the slot, with a WebSocket attached or without.
    assert report["closed_active"] == 0
    assert report["listed_only"] == ["increment", "get_value", "submit"]
    assert report["listed_active"] == 1
    assert report["listed_closed_active"] == 0
    # .sync() with `with`, as OpenEnv's README shows it.
    assert (report["sync_stepped"], report["sync_value"]) == (5, 5)
    assert report["sync_closed_active"] == 0


def test_openenv_010_mcp_tool_client_that_vanishes_is_reaped(peer_python: Path) -> None:
    # The client exits without close(): HTTP has no connection to watch, so its
    # session ends once idle past session_timeout, and its slot is freed.
    with run_server(counter_app(2, session_timeout=1)) as url:
        report = run_peer_script(peer_python, MCP_SCRIPT, url, "vanish")
        assert report["called"] == {"value": 1}
        assert report["vanished_active"] == 1
        asyncio.run(until_active(url, 0))


def test_openenv_010_mcp_tool_client_is_told_the_server_is_full(peer_python: Path) -> None:
    with run_server(counter_app(1)) as url, CounterEnv(url) as held:
        held.reset()  # the one slot, held over /ws
        report = run_peer_script(peer_python, MCP_SCRIPT, url, "full")
        assert HTTP.get(f"{url}/health").json()["active_sessions"] == 1
    assert "connected" not in report
    assert report["connect_failed"] == {
        "type": "RuntimeError",
        "message": "Failed to create MCP session: server at capacity (1 sessions); retry later",
    }


async def mcp_tool_names(url: str) -> list[str]:
    async with Client(url) as mcp:
        return [tool.name for tool in (await mcp.list_tools()).tools]
