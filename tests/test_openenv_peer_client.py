"""OpenEnv 0.10's real client, in a virtual environment of its own, against our server.

PyPI's ``openenv`` (Hugging Face's OpenEnv) imports as ``openenv`` too, so it
lives in a venv of its own (``tests/peer_venvs.py``: make's
``.venv-openenv-peer``, else one made by this test), and
``tests/apps/openenv_peer_client.py`` runs there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from peer_venvs import APPS, run_peer_script
from peer_venvs import peer_python as peer_venv

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, create_app
from openenv.testing import run_server

SCRIPT = APPS / "openenv_peer_client.py"
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
