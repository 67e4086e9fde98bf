"""``/metrics`` under ``openenv serve --workers 2``: whichever worker answers a
scrape, its counters never go back, and a killed worker leaves no gauge behind."""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from pathlib import Path

import pytest
from cli_envs import write_env
from prometheus_client.parser import text_string_to_metric_families
from test_cli_serve import Ping, eventually, health, open_sessions, serving
from test_serve_supervisor import reaped
from v2_wire import raw_v2, replies, send

# A step asked to "block" holds its worker's thread for good; with one request
# in flight allowed, a second request pauses the v2 connection that sent it.
BLOCKING = """\
import time


class Blocking(PidEnvironment):
    def step(self, action: Ping, **kwargs: Any) -> Where:
        if action.note == "block":
            time.sleep(600)
        return super().step(action)


make = Blocking
"""
CONFIG = "ConcurrencyConfig(max_concurrent_envs=8), max_requests_in_flight=1"

Scrape = dict[str, float]


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


COUNTERS = ("openenv_steps_total", "openenv_sessions_opened_total", "openenv_step_seconds_count")


class Scrapes:
    """Every scrape taken, each checked to count no less than the one before."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.last: Scrape | None = None

    def take(self) -> Scrape:
        now = scrape(self.url)
        if self.last is not None:
            for name in COUNTERS:
                assert now[name] >= self.last[name], (name, self.last[name], now[name])
        self.last = now
        return now


@pytest.mark.timeout(120)
def test_counters_never_go_back_and_a_killed_workers_gauges_go_with_it(tmp_path: Path) -> None:
    folder = write_env(tmp_path / "env", factory=BLOCKING, config=CONFIG)
    log = folder / "serve.log"

    async def scenario(url: str) -> None:
        scrapes = Scrapes(url)
        await eventually(lambda: health(url).get("workers") == 2, "a worker did not start", log)
        held = await open_sessions(url, 4)
        try:
            # Steps go on while scrapes land on either worker.
            async def load() -> None:
                while True:
                    await asyncio.gather(*(client.step(Ping()) for client, _ in held))

            stepping = asyncio.create_task(load())
            for _ in range(40):
                await asyncio.to_thread(scrapes.take)
            stepping.cancel()
        finally:
            await asyncio.gather(*(client.close() for client, _ in held))

        ws = await raw_v2(url)
        try:
            await send(ws, [{"session": 0, "type": "open"}])
            await replies(ws, 1)
            await send(ws, [{"session": 0, "type": "reset"}])
            victim = (await replies(ws, 1))[0]["data"]["observation"]["pid"]
            for note in ("block", ""):  # the second waits: the connection is paused
                await send(ws, [{"session": 0, "type": "step", "data": {"note": note}}])

            streak = 0

            def paused_everywhere() -> bool:
                # Whichever worker answers: the victim's gauge reached the board.
                nonlocal streak
                streak = streak + 1 if scrapes.take()["openenv_v2_connections_paused"] else 0
                return streak >= 20

            await eventually(paused_everywhere, "the connection was not seen paused", log)
            before = scrapes.last
            assert before is not None
            os.kill(victim, signal.SIGKILL)
            await eventually(
                lambda: (
                    health(url).get("workers") == 2
                    and scrapes.take()["openenv_v2_connections_paused"] == 0
                ),
                "the killed worker's paused connection stayed in the gauge",
                log,
            )
            for _ in range(10):  # and stays out, whoever answers
                assert scrapes.take()["openenv_v2_connections_paused"] == 0
            assert scrapes.take()["openenv_steps_total"] >= before["openenv_steps_total"]
        finally:
            await ws.close()

    with serving(folder, "--workers", "2") as (url, proc), reaped(proc):
        asyncio.run(scenario(url))
