"""A recorded server (``record=``) keeps what a web page's player did, not the
page's own background requests, in Chromium."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from playwright.async_api import Page, expect
from web_page_kit import reset, state, step_echo, wait_for_sessions
from websockets.asyncio.client import connect

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, create_app
from openenv.client import ws_url
from openenv.testing import run_server
from openenv.trajectories import load

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _calls(folder: Path) -> dict[str, list[str]]:
    """The request types each recorded session made, in order."""
    calls: dict[str, list[str]] = {}
    for file in folder.glob("*.jsonl"):
        for line in file.read_bytes().splitlines():
            event: dict[str, Any] = orjson.loads(line)
            kinds = calls.setdefault(event["session"], [])
            if event["event"] == "call":
                kinds.append(event["request"]["type"])
    return calls


async def test_a_queued_tab_and_its_state_panel_leave_no_lines_in_the_recording(
    tmp_path: Path, new_page: Callable[..., Awaitable[Page]]
) -> None:
    # The queued tab learns its session has opened from a list_tools reply, and
    # the state panel asks for the state after each reset and step: neither is
    # the player's, and the list_tools, first, read back as an episode of its own.
    folder = tmp_path / "rec"
    concurrency = ConcurrencyConfig(max_concurrent_envs=1, queue_timeout=60)
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, concurrency, record=str(folder))
    with run_server(app) as url:
        first = await new_page(url)
        await reset(first)
        second = await new_page(url)
        status = second.locator("#status")
        await expect(status).to_contain_text("Waiting for a free slot")
        await first.context.close()
        await expect(status).to_have_text(
            "Connected: a new session. Press Reset to start an episode."
        )
        await reset(second)
        await step_echo(second, "mine")
        assert (await state(second))["step_count"] == 1  # the panel still shows it
        await second.context.close()
        await wait_for_sessions(url, 0)  # each session's lines are on disk once it closes

        # A program's own list_tools and state are its choice, and recorded.
        async with connect(ws_url(url)) as ws:
            for request in ('{"type": "list_tools"}', '{"type": "state"}'):
                await ws.send(request)
                await ws.recv()
        await wait_for_sessions(url, 0)

    assert sorted(_calls(folder).values()) == [
        ["list_tools", "state"],
        ["reset"],
        ["reset", "step"],
    ]
    played = [e for e in load(folder) if e.steps[0].kind == "reset"]
    assert [[step.kind for step in e.steps] for e in played] == [["reset"], ["reset", "step"]]
