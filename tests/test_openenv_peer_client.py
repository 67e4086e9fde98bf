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
from tool_envs import HTTP

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


def test_openenv_010_mcp_tool_client_is_told_what_is_not_served(peer_python: Path) -> None:
    # OpenEnv's MCPToolClient has only its production mode: OpenEnv's own /mcp
    # session methods (openenv/session/create, then session_id in each call's
    # params), which openenv's /mcp (the MCP SDK's streamable HTTP) does not
    # serve. It got "400 Bad Request" with nothing saying why.
    app = create_app(
        CounterEnvironment,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=1),
        mcp=True,
    )
    with run_server(app) as url:
        report = run_peer_script(peer_python, MCP_SCRIPT, url)
        assert HTTP.get(f"{url}/health").json()["active_sessions"] == 0  # no slot taken
        # The standard MCP surface is untouched, its one slot still free.
        listed = asyncio.run(mcp_tool_names(f"{url}/mcp"))
    assert listed == ["increment", "get_value", "submit"]
    assert report["tools"] == []  # OpenEnv's list_tools() swallows every failure
    # call_tool() and connecting each open OpenEnv's session first.
    for failed in (report["call_failed"], report["connect_failed"]):
        assert failed["type"] == "RuntimeError"
        assert failed["message"].startswith(
            "Failed to create MCP session: openenv/session/create is OpenEnv's own "
            "/mcp session protocol"
        )
        assert "openenv.core.mcp_client.MCPToolClient" in failed["message"]
    assert "called" not in report
    assert "connected" not in report


async def mcp_tool_names(url: str) -> list[str]:
    async with Client(url) as mcp:
        return [tool.name for tool in (await mcp.list_tools()).tools]
