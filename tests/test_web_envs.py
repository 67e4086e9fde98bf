"""``/web`` plays the other reference environments to their end, in real Chromium.

coding_env (a multi-line program in a text area, graded by Step or by its
tools), benchmark_env (a Literal choice), CartPole until the pole falls, a
one-field Literal action as buttons, an image returned by a tool, and the
connection banner staying in view on a scrolled page.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, expect
from tcp_proxy import TcpProxy
from web_page_kit import chromium, keep_screenshot

from openenv import (
    Action,
    ConcurrencyConfig,
    Environment,
    ImageContent,
    Observation,
    State,
    TextContent,
    ToolOutput,
    create_app,
    tool,
)
from openenv.adapters.gymnasium import create_gymnasium_app
from openenv.adapters.gymnasium.frames import png_data_url
from openenv.testing import run_server

DOCS = Path(__file__).parents[1] / "docs"

expect.set_options(timeout=15_000)
pytestmark = pytest.mark.asyncio(loop_scope="module")

GCD = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as browser:
        yield browser


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 1000})
    page = await context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    yield page
    await context.close()
    assert problems == []


def fact(page: Page, name: str) -> Any:
    """The value of one of the observation's scalar fields, as the page shows it."""
    return page.locator(f'.facts [data-field="{name}"] dd')


# -- coding_env ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def coding_url() -> Iterator[str]:
    from coding_env.server.app import app

    with run_server(app) as url:
        yield url


async def choose_task(page: Page, split: str, task: str) -> None:
    await page.get_by_label("Split").select_option(split)
    await page.get_by_label("Task", exact=True).select_option(label=task)
    await page.get_by_role("button", name="Reset").click()
    await expect(page.get_by_label("Task prompt")).to_be_visible()


async def test_coding_env_is_solved_with_a_multi_line_program(page: Page, coding_url: str) -> None:
    await page.goto(f"{coding_url}/web")
    await choose_task(page, "test", "test-gcd")
    await expect(page.get_by_label("Task prompt")).to_contain_text("gcd(a, b)")
    action = page.locator("#action-form")
    code = action.get_by_label("Code")
    # Python source is a text area: the program keeps its lines and indentation.
    assert await code.evaluate("node => node.tagName") == "TEXTAREA"
    await code.fill("print(gcd)\n")
    await page.get_by_role("button", name="Step").click()
    execution = page.get_by_role("table", name="execution")

    def row(name: str) -> Any:
        return execution.locator("tr", has=page.get_by_role("rowheader", name=name, exact=True))

    await expect(row("status").locator("td")).to_have_text("error")
    await expect(row("stderr").locator("td")).to_contain_text("NameError: name 'gcd'")

    await code.fill(GCD)
    await action.get_by_label("Submit").check()
    await page.get_by_role("button", name="Step").click()
    await expect(page.locator("#done")).to_have_text("yes")
    await expect(page.locator("#total-reward")).to_have_text("1")
    await expect(fact(page, "tests_passed")).to_have_text("4")
    tests = page.get_by_role("table", name="tests")
    await expect(tests.locator("tbody tr")).to_have_count(4)
    await expect(tests.locator("tbody tr td:nth-child(2)")).to_have_text(["true"] * 4)
    await expect(page.get_by_role("button", name="Step")).to_be_disabled()
    await expect(page.get_by_role("button", name="Call submit")).to_be_disabled()
    await keep_screenshot(page, await page.screenshot(full_page=True), DOCS / "web-coding.png")


async def test_coding_env_is_played_through_its_tools(page: Page, coding_url: str) -> None:
    await page.goto(f"{coding_url}/web")
    await choose_task(page, "test", "test-gcd")
    run = page.get_by_role("form", name="Tool run_code")
    program = run.get_by_label("Code")
    assert await program.evaluate("node => node.tagName") == "TEXTAREA"
    await program.fill("for k in range(3):\n    print(k * k)\n")
    await run.get_by_role("button", name="Call run_code").click()
    await expect(run.locator(".tool-result")).to_contain_text('"stdout": "0\\n1\\n4\\n"')

    submit = page.get_by_role("form", name="Tool submit")
    await submit.get_by_label("Code").fill("def gcd(a, b):\n    return a\n")  # wrong
    await submit.get_by_role("button", name="Call submit").click()
    await expect(submit.locator(".tool-facts")).to_have_text(
        re.compile(r"^reward 0\.\d+ · episode finished$")
    )
    await expect(page.locator("#done")).to_have_text("yes")
    await expect(page.get_by_role("button", name="Call run_code")).to_be_disabled()
    await expect(page.get_by_role("button", name="Step")).to_be_disabled()


# -- benchmark_env ---------------------------------------------------------------------


async def test_benchmark_env_steps_with_its_literal_choice(page: Page) -> None:
    from benchmark_env.server.app import app

    with run_server(app) as url:
        await page.goto(f"{url}/web")
        await page.get_by_role("button", name="Reset").click()
        await expect(fact(page, "step")).to_have_text("0")
        work = page.locator("#action-form").get_by_label("Work")
        await expect(work.locator("option")).to_have_text(["wait", "cpu"])
        await work.select_option("cpu")
        await page.locator("#action-form").get_by_label("Seconds").fill("0.01")
        await page.get_by_role("button", name="Step").click()
        await expect(fact(page, "step")).to_have_text("1")
        await expect(fact(page, "pid")).to_have_text(str(os.getpid()))  # served in-process
        await page.get_by_role("button", name="Step").click()
        await expect(fact(page, "step")).to_have_text("2")
        rows = page.locator("#history tbody tr:not(.detail)")
        await expect(rows.first).to_contain_text('"work":"cpu"')


# -- CartPole to its end ----------------------------------------------------------------


async def test_cartpole_is_played_until_the_pole_falls(page: Page) -> None:
    app = create_gymnasium_app(
        "CartPole-v1",
        ConcurrencyConfig(max_concurrent_envs=2),
        make_kwargs={"render_mode": "rgb_array"},
    )
    with run_server(app) as url:
        await page.goto(f"{url}/web")
        await page.get_by_label("Seed").fill("0")
        await page.get_by_role("button", name="Reset").click()
        right = page.get_by_role("group", name="Step with").get_by_role("button").last
        frame = page.get_by_role("img", name="frame (rendered)")
        first = await frame.get_attribute("src")
        # Always pushing right tips the pole over within a few dozen steps.
        for count in range(1, 60):
            await right.click()
            await expect(page.locator("#step-count")).to_have_text(str(count))
            if await page.locator("#done").inner_text() == "yes":
                break
        await expect(page.locator("#done")).to_have_text("yes")
        await expect(right).to_be_disabled()
        await expect(page.get_by_role("button", name="Step")).to_be_disabled()
        await expect(frame).not_to_have_attribute("src", first or "")
        await page.get_by_role("button", name="Reset").click()
        await expect(right).to_be_enabled()


# -- a Literal action and an image from a tool ---------------------------------------------


class LampAction(Action):
    switch: Literal["on", "off"]


class LampObservation(Observation):
    lit: bool = False


class Lamp(Environment[LampAction, LampObservation, State]):
    """A lamp: switch it; its photo tool shows it yellow when lit, black when not."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State()
        self.lit = False

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Any:
        self._state = State(episode_id=episode_id)
        self.lit = False
        return LampObservation(lit=False)

    def step(self, action: LampAction, **_: Any) -> LampObservation:
        self._state.step_count += 1
        self.lit = action.switch == "on"
        return LampObservation(lit=self.lit, reward=1.0 if self.lit else 0.0)

    @property
    def state(self) -> State:
        return self._state

    @tool
    def photo(self, size: int = 6) -> ToolOutput:
        """A size x size picture of the lamp."""
        import numpy as np

        pixels = np.zeros((size, size, 3), dtype=np.uint8)
        if self.lit:
            pixels[:, :, 0] = pixels[:, :, 1] = 255
        url = png_data_url(pixels)
        data = url.split(",", 1)[1]
        assert base64.b64decode(data).startswith(b"\x89PNG")
        return ToolOutput(
            content=[
                TextContent(text="lit" if self.lit else "dark"),
                ImageContent(data=data, mime_type="image/png"),
            ]
        )


PIXEL = """image => {
  const canvas = document.createElement("canvas");
  canvas.width = image.naturalWidth;
  canvas.height = image.naturalHeight;
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  return [image.naturalWidth, ...context.getImageData(0, 0, 1, 1).data.slice(0, 3)];
}"""


async def test_literal_buttons_and_an_image_from_a_tool(page: Page) -> None:
    app = create_app(Lamp, LampAction, LampObservation, max_concurrent_envs=2)
    with run_server(app) as url:
        await page.goto(f"{url}/web")
        buttons = page.get_by_role("group", name="Step with").get_by_role("button")
        await expect(buttons).to_have_text(["switch = on", "switch = off"])
        await page.get_by_role("button", name="Reset").click()
        await buttons.first.click()
        await expect(fact(page, "lit")).to_have_text("true")
        card = page.get_by_role("form", name="Tool photo")
        await card.get_by_label("Size").fill("5")
        await card.get_by_role("button", name="Call photo").click()
        image = card.get_by_role("img", name="tool result image")
        await expect(card.locator(".tool-result pre")).to_have_text("lit")
        await expect(image).to_have_attribute("src", re.compile(r"^data:image/png;base64,"))
        await expect(image).to_have_js_property("complete", True)
        assert await image.evaluate(PIXEL) == [5, 255, 255, 0]  # lit: yellow

        await buttons.last.click()
        await expect(fact(page, "lit")).to_have_text("false")
        await card.get_by_role("button", name="Call photo").click()
        await expect(card.locator(".tool-result pre")).to_have_text("dark")
        await expect(image).to_have_js_property("complete", True)
        assert await image.evaluate(PIXEL) == [5, 0, 0, 0]  # dark: black


class CoinAction(Action):
    heads: bool


class Coin(Lamp):
    """A bet on a coin that always lands heads: one bool, so two buttons."""

    def step(self, action: CoinAction, **_: Any) -> LampObservation:  # type: ignore[override]
        self._state.step_count += 1
        return LampObservation(lit=action.heads, reward=1.0 if action.heads else 0.0, done=True)


async def test_a_bool_action_gets_a_button_per_value(page: Page) -> None:
    app = create_app(Coin, CoinAction, LampObservation, max_concurrent_envs=2)
    with run_server(app) as url:
        await page.goto(f"{url}/web")
        buttons = page.get_by_role("group", name="Step with").get_by_role("button")
        await expect(buttons).to_have_text(["heads = true", "heads = false"])
        await page.get_by_role("button", name="Reset").click()
        await buttons.last.click()
        await expect(fact(page, "lit")).to_have_text("false")
        await expect(page.locator("#reward")).to_have_text("0")
        await expect(buttons.first).to_be_disabled()  # done
        await page.get_by_role("button", name="Reset").click()
        await buttons.first.click()
        await expect(page.locator("#reward")).to_have_text("1")


# -- the connection banner stays in view -------------------------------------------------


async def test_the_connection_banner_stays_in_view_on_a_scrolled_page(
    browser: Browser, coding_url: str
) -> None:
    context = await browser.new_context(viewport={"width": 390, "height": 600})
    try:
        with TcpProxy(coding_url) as proxy:
            page = await context.new_page()
            await page.goto(f"{proxy.url}/web")
            await page.get_by_role("button", name="Reset").click()
            await expect(page.locator("#status")).to_contain_text("Episode started")
            await page.get_by_role("button", name="Export JSONL").scroll_into_view_if_needed()
            scrolled = await page.evaluate("window.scrollY")
            assert scrolled > 600  # far down: the top of the page is out of view
            assert proxy.cut() >= 1
            banner = page.locator("#connection-banner")
            await expect(banner).to_contain_text("The connection to the server was lost")
            await expect(banner).to_be_in_viewport()
            await expect(page.get_by_role("button", name="Reconnect")).to_be_in_viewport()
            # Not by scrolling back up (the browser's scroll anchoring may move down a little,
            # by the banner's height, to keep the content under the eye still).
            assert await page.evaluate("window.scrollY") >= scrolled
    finally:
        await context.close()
