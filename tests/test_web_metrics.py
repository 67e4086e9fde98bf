"""The operator's view on ``/web``: the server's own numbers, live, in real Chromium."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Route, expect
from web_page_kit import chromium, keep_screenshot

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, WebSocketEnvClient, create_app
from openenv.testing import run_server

SCREENSHOT = Path(__file__).parents[1] / "docs" / "web-metrics.png"

expect.set_options(timeout=15_000)
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=8)
    )
    with run_server(app) as url:
        yield url


async def test_the_server_panel_shows_live_numbers(browser: Browser, echo_url: str) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = await context.new_page()
        await page.goto(f"{echo_url}/web")
        await expect(page.get_by_role("button", name="Reset")).to_be_enabled()
        await page.get_by_text("Server: sessions, queue, steps/s, latency").click()
        # The page's own session holds one of the eight slots.
        await expect(page.locator("#m-sessions")).to_have_text("1 / 8")
        await expect(page.locator("#m-queued")).to_have_text("0")
        await expect(page.locator("#m-steps")).to_have_text("0")
        await expect(page.locator("#m-errors")).to_have_text("none")

        async with WebSocketEnvClient(echo_url) as env:
            await env.reset()
            for k in range(300):
                await env.step({"message": f"m{k}"})
            await expect(page.locator("#m-sessions")).to_have_text("2 / 8")
            await expect(page.locator("#m-steps")).to_have_text("300")
            # Rate and latency describe the steps between two polls: keep stepping
            # until a poll interval has seen some (with a deadline).
            deadline = time.monotonic() + 15
            while not (await page.locator("#m-p50").inner_text()).endswith(" ms"):
                assert time.monotonic() < deadline, "latency shown within 15 s of steps"
                for k in range(50):
                    await env.step({"message": f"n{k}"})
            await expect(page.locator("#m-p50")).to_have_text(re.compile(r"^\d[\d.]* ms$"))
            await expect(page.locator("#m-p99")).to_have_text(re.compile(r"^\d[\d.]* ms$"))
            await expect(page.locator("#m-rate")).to_have_text(re.compile(r"^[1-9][\d,]*$"))
            image = await page.locator("#server-metrics").screenshot()
            await keep_screenshot(page, image, SCREENSHOT)
        await expect(page.locator("#m-sessions")).to_have_text("1 / 8")
    finally:
        await context.close()


async def test_errors_are_counted_by_code(browser: Browser, echo_url: str) -> None:
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await page.goto(f"{echo_url}/web")
        await page.get_by_text("Server: sessions, queue, steps/s, latency").click()
        async with WebSocketEnvClient(echo_url) as env:
            await env.reset()
            with pytest.raises(Exception, match="VALIDATION_ERROR"):
                await env.step({"no_such_field": 1})
        await expect(page.locator("#m-errors")).to_have_text("VALIDATION_ERROR: 1")
    finally:
        await context.close()


async def test_a_server_slow_to_answer_is_not_polled_again_meanwhile(
    browser: Browser, echo_url: str
) -> None:
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await page.clock.install()  # the poll's timer runs when the test says
        asked: asyncio.Queue[Route] = asyncio.Queue()
        await page.route("**/metrics", asked.put)
        await page.goto(f"{echo_url}/web")
        await page.get_by_text("Server: sessions, queue, steps/s, latency").click()
        first = await asked.get()
        await page.clock.run_for(5_000)  # five periods while the first answer is held
        await first.continue_()
        await expect(page.locator("#m-sessions")).to_have_text("1 / 8")
        await page.clock.run_for(1_000)  # the next period asks again
        await (await asked.get()).continue_()
        # A request made after all of those, answered: they have all been routed.
        assert await page.evaluate("fetch('metadata').then((response) => response.ok)")
        assert asked.empty()
    finally:
        await context.close()
