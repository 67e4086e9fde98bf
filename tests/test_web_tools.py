"""``/web`` plays a tool environment to the end, in real Chromium: counter_env through its tools."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, Route, expect
from web_page_kit import chromium, keep_screenshot

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, create_app, tool
from openenv.adapters.gymnasium import create_gymnasium_app
from openenv.testing import run_server
from wordle_env import WordleAction
from wordle_env.models import WordleObservation
from wordle_env.server.environment import WordleEnvironment
from wordle_env.server.words import answers

SCREENSHOT = Path(__file__).parents[1] / "docs" / "web-counter.png"
WORDLE_SCREENSHOT = SCREENSHOT.with_name("web-wordle.png")
CARTPOLE_SCREENSHOT = SCREENSHOT.with_name("web-cartpole.png")

expect.set_options(timeout=15_000)
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def counter_url() -> Iterator[str]:
    app = create_app(
        CounterEnvironment,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=4),
    )
    with run_server(app) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(
        viewport={"width": 1280, "height": 1000}, accept_downloads=True
    )
    yield await context.new_page()
    await context.close()


async def call(page: Page, tool: str, **arguments: int) -> None:
    card = page.get_by_role("form", name=f"Tool {tool}")
    for name, value in arguments.items():
        await card.get_by_label(name.capitalize()).fill(str(value))
    await card.get_by_role("button", name=f"Call {tool}").click()


async def test_counter_env_is_played_to_reward_one_through_its_tools(
    page: Page, counter_url: str, tmp_path: Path
) -> None:
    await page.goto(f"{counter_url}/web")
    await expect(page.get_by_role("heading", name="Tools")).to_be_visible()
    tools = page.locator("#tools h3")
    await expect(tools).to_have_text(["increment", "get_value", "submit"])
    # Before an episode starts, the tools wait for Reset like Step does.
    await expect(page.get_by_role("button", name="Call submit")).to_be_disabled()

    await page.get_by_label("Seed").fill("0")
    await page.get_by_role("button", name="Reset").click()
    await expect(page.locator("#status")).to_have_text(
        "Episode started: fill in the action and press Step."
    )
    target = json.loads(await page.locator("#observation").inner_text())["target"]
    await expect(page.get_by_role("button", name="Call increment")).to_be_enabled()

    await call(page, "increment", amount=target - 1)
    increment = page.get_by_role("form", name="Tool increment")
    await expect(increment.locator(".tool-result")).to_contain_text(str(target - 1))
    await call(page, "increment", amount=1)
    await expect(increment.locator(".tool-result")).to_contain_text(str(target))
    await call(page, "submit")
    submit = page.get_by_role("form", name="Tool submit")
    await expect(submit.locator(".tool-facts")).to_have_text("reward 1 · episode finished")
    await expect(page.locator("#total-reward")).to_have_text("1")
    await expect(page.locator("#done")).to_have_text("yes")
    # The episode is over: neither Step nor a tool plays on until a Reset.
    await expect(page.get_by_role("button", name="Step")).to_be_disabled()
    await expect(page.get_by_role("button", name="Call increment")).to_be_disabled()
    await expect(page.get_by_role("button", name="Reset")).to_be_enabled()
    await keep_screenshot(page, await page.screenshot(full_page=True), SCREENSHOT)

    async with page.expect_download() as waiting:
        await page.get_by_role("button", name="Export JSONL").click()
    saved = tmp_path / "episode.jsonl"
    await (await waiting.value).save_as(saved)
    entries = [json.loads(line) for line in saved.read_text().splitlines()]
    assert [e["type"] for e in entries] == ["reset", "call_tool", "call_tool", "call_tool"]
    assert entries[0]["request"] == {"seed": 0}
    assert [e["request"]["name"] for e in entries[1:]] == ["increment", "increment", "submit"]
    assert entries[-1]["reply"]["reward"] == 1.0
    assert entries[-1]["reply"]["finished"] is True


async def test_step_is_disabled_once_an_episode_is_done(page: Page) -> None:
    def one_step() -> EchoEnvironment:
        return EchoEnvironment(max_steps=1)

    app = create_app(one_step, EchoAction, EchoObservation, max_concurrent_envs=2)
    with run_server(app) as url:
        await page.goto(f"{url}/web")
        await expect(page.locator("#tools-panel")).to_be_hidden()  # echo has no tools
        await page.get_by_role("button", name="Reset").click()
        await page.get_by_label("Message").fill("last")
        await page.get_by_role("button", name="Step").click()
        await expect(page.locator("#done")).to_have_text("yes")
        await expect(page.get_by_role("button", name="Step")).to_be_disabled()
        await page.get_by_role("button", name="Reset").click()
        await expect(page.get_by_role("button", name="Step")).to_be_enabled()


class GatedCounter(CounterEnvironment):
    """The counter, plus a tool that waits (on a thread) until the test opens the gate."""

    gate = threading.Event()

    @tool
    def wait(self) -> str:
        """Wait for the gate."""
        assert GatedCounter.gate.wait(60)
        return "through"


async def test_a_tool_call_in_flight_holds_step_and_reset_as_a_step_does(page: Page) -> None:
    GatedCounter.gate.clear()
    app = create_app(GatedCounter, CounterAction, CounterObservation)
    with run_server(app) as url:
        await page.goto(f"{url}/web")
        await page.get_by_role("button", name="Reset").click()
        await expect(page.get_by_role("button", name="Call wait")).to_be_enabled()
        try:
            await call(page, "wait")
            # The call is out: its session takes nothing else meanwhile (a Step
            # or a Reset pressed now would wait behind it, or land mid-call).
            await expect(page.get_by_role("button", name="Step")).to_be_disabled()
            await expect(page.get_by_role("button", name="Reset")).to_be_disabled()
            await expect(page.get_by_role("button", name="Call increment")).to_be_disabled()
            await expect(page.get_by_role("button", name="Refresh state")).to_be_disabled()
        finally:
            GatedCounter.gate.set()
        wait = page.get_by_role("form", name="Tool wait")
        await expect(wait.locator(".tool-result")).to_contain_text("through")
        await expect(page.get_by_role("button", name="Step")).to_be_enabled()
        await expect(page.get_by_role("button", name="Reset")).to_be_enabled()
        await call(page, "increment", amount=2)
        increment = page.get_by_role("form", name="Tool increment")
        await expect(increment.locator(".tool-result")).to_contain_text("2")


async def test_tool_calls_are_rows_of_the_history(page: Page, counter_url: str) -> None:
    await page.goto(f"{counter_url}/web")
    await page.get_by_role("button", name="Reset").click()
    await expect(page.get_by_role("button", name="Call increment")).to_be_enabled()
    await call(page, "increment", amount=2)
    rows = page.locator("#history tbody tr:not(.detail)")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text('increment({"amount":2})')
    await expect(rows.first.locator("th")).to_have_text("tool")


@pytest.fixture(scope="module")
def wordle_url() -> Iterator[str]:
    app = create_app(
        WordleEnvironment, WordleAction, WordleObservation, ConcurrencyConfig(max_concurrent_envs=4)
    )
    with run_server(app) as url:
        yield url


async def test_the_split_chosen_last_is_listed_whatever_order_the_lists_arrive_in(
    page: Page, wordle_url: str
) -> None:
    # The first split's list is held back until the user has chosen another split
    # and its list is shown: the late answer must not replace it.
    held: asyncio.Queue[Route] = asyncio.Queue()
    await page.route(re.compile(r"/tasks\?split=train&"), held.put)
    await page.goto(f"{wordle_url}/web")
    first = await held.get()
    await page.get_by_label("Split").select_option("test")
    count = page.locator("#task-count")
    tasks = page.get_by_label("Task", exact=True)
    await expect(count).to_have_text(re.compile(r"^\d+ tasks in test"))
    await expect(tasks).to_have_attribute("aria-busy", "true")
    await first.continue_()
    await expect(tasks).to_have_attribute("aria-busy", "false")
    await expect(count).to_have_text(re.compile(r"^\d+ tasks in test"))
    await expect(tasks.locator("option").nth(1)).to_have_text("test-0000")
    await tasks.select_option(label="test-0001")
    await page.get_by_role("button", name="Reset").click()
    await expect(page.get_by_label("Task prompt")).to_contain_text("five-letter")


async def test_a_split_whose_list_fails_says_so(page: Page, wordle_url: str) -> None:
    async def fail(route: Route) -> None:
        await route.fulfill(status=500, body="no")

    await page.route(re.compile(r"/tasks\?split=test&"), fail)
    await page.goto(f"{wordle_url}/web")
    await expect(page.locator("#task-count")).to_have_text(re.compile(r"^\d+ tasks in train"))
    await page.get_by_label("Split").select_option("test")
    await expect(page.locator("#task-count")).to_have_text(
        "Could not list the tasks of test: GET tasks?split=test&limit=200 answered 500"
    )
    # No task of the other split is left to be chosen by mistake.
    await expect(page.get_by_label("Task", exact=True).locator("option")).to_have_count(1)


async def test_a_wordle_game_from_a_chosen_task_is_won(page: Page, wordle_url: str) -> None:
    await page.goto(f"{wordle_url}/web")
    await expect(page.get_by_label("Split")).to_have_value("train")
    await page.get_by_label("Split").select_option("test")
    await expect(page.locator("#task-count")).to_have_text(re.compile(r"^\d+ tasks in test"))
    await page.get_by_label("Task", exact=True).select_option(label="test-0001")
    await page.get_by_role("button", name="Reset").click()
    await expect(page.get_by_label("Task prompt")).to_contain_text("five-letter")
    guess = page.locator("#action-form").get_by_label("Guess")
    step = page.get_by_role("button", name="Step")
    # A word the game does not know: its message is next to the Step button, in view.
    await guess.fill("xyzzy")
    await step.click()
    reply = page.get_by_label("Latest reply")
    await expect(reply).to_have_text("'xyzzy' is not in the word list; no guess was used")
    await expect(reply).to_be_in_viewport()
    await expect(page.locator('.facts [data-field="guesses_left"] dd')).to_have_text("6")
    # test-0001's word, from the environment's own list: the chosen task is the one played.
    answer = answers("test")[1]
    wrong = next(word for word in answers("test") if word[0] not in answer)
    await guess.fill(wrong)
    await step.click()
    await expect(page.locator('.facts [data-field="guesses_left"] dd')).to_have_text("5")
    await guess.fill(answer)
    await step.click()
    await expect(page.locator("#done")).to_have_text("yes")
    await expect(page.locator("#total-reward")).to_have_text("1")
    await expect(step).to_be_disabled()
    await expect(reply).to_have_text("solved in 2 guesses")
    # The board is drawn as tiles, a row per guess, each letter marked by colour.
    board = page.get_by_role("table", name="board")
    rows = board.locator("tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0).locator(".tile")).to_have_text(list(wrong))
    await expect(rows.nth(0).locator(".tile").first).to_have_attribute("data-mark", "absent")
    await expect(rows.nth(1).locator(".tile")).to_have_text(list(answer))
    marks = rows.nth(1).locator(".tile")
    for index in range(5):
        await expect(marks.nth(index)).to_have_attribute("data-mark", "correct")
    green = await marks.first.evaluate("tile => getComputedStyle(tile).backgroundColor")
    grey = (
        await rows.nth(0)
        .locator(".tile")
        .first.evaluate("tile => getComputedStyle(tile).backgroundColor")
    )
    assert green != grey
    await expect(rows.nth(1).locator("td").last).to_have_text("GGGGG")  # the pattern beside
    await keep_screenshot(page, await page.screenshot(full_page=True), WORDLE_SCREENSHOT)


@pytest.fixture(scope="module")
def cartpole_url() -> Iterator[str]:
    app = create_gymnasium_app(
        "CartPole-v1",
        ConcurrencyConfig(max_concurrent_envs=2),
        make_kwargs={"render_mode": "rgb_array"},
    )
    with run_server(app) as url:
        yield url


async def test_cartpole_shows_its_frame_and_steps_by_buttons(page: Page, cartpole_url: str) -> None:
    await page.goto(f"{cartpole_url}/web")
    # Discrete(2): a button per action, beside the form.
    buttons = page.get_by_role("group", name="Step with").get_by_role("button")
    await expect(buttons).to_have_text(["action = 0", "action = 1"])
    await expect(buttons.first).to_be_disabled()  # no episode yet
    await page.get_by_label("Seed").fill("3")
    await page.get_by_role("button", name="Reset").click()
    frame = page.get_by_role("img", name="frame (rendered)")
    await expect(frame).to_have_attribute("src", re.compile(r"^data:image/png;base64,"))
    before = await frame.get_attribute("src")
    assert "data:image" not in await page.locator("#observation").inner_text()
    # Pushed right a few times, the cart moves by whole pixels.
    for count in range(1, 7):
        await buttons.last.click()
        await expect(page.locator("#step-count")).to_have_text(str(count))
    await expect(frame).not_to_have_attribute("src", before or "")
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(6)
    await expect(page.locator("#history tbody tr:not(.detail)").first).to_contain_text(
        '{"action":1}'
    )
    await keep_screenshot(page, await page.screenshot(full_page=True), CARTPOLE_SCREENSHOT)


async def test_a_history_row_opens_to_the_whole_reply(page: Page, counter_url: str) -> None:
    await page.goto(f"{counter_url}/web")
    await page.get_by_role("button", name="Reset").click()
    await expect(page.get_by_role("button", name="Call increment")).to_be_enabled()
    await call(page, "increment", amount=3)
    toggle = page.locator("#history tbody tr:not(.detail)").first.get_by_role("button")
    detail = page.locator("#history tr.detail").first
    await expect(detail).to_be_hidden()
    await toggle.click()
    await expect(toggle).to_have_attribute("aria-expanded", "true")
    await expect(detail).to_be_visible()
    assert json.loads(await detail.inner_text())["content"][0]["data"] == {"value": 3}
    await toggle.click()
    await expect(detail).to_be_hidden()
