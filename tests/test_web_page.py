"""The page at ``/web``, played in a real Chromium against real uvicorn servers."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator

import pytest
from playwright.async_api import Page, expect
from web_page_kit import (
    SCREENSHOT,
    active_sessions,
    changed_pixels,
    echo_app,
    idle,
    keep_screenshot,
    move_app,
    observation,
    reset,
    state,
    step_echo,
    wait_for_sessions,
)

from openenv.testing import run_server

# Every test here shares the browser, so all of them run on the session's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with run_server(echo_app()) as url:
        yield url


@pytest.fixture(scope="module")
def move_url() -> Iterator[str]:
    with run_server(move_app()) as url:
        yield url


# -- playing ----------------------------------------------------------------------------


async def test_plays_a_full_echo_episode(
    echo_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(echo_url)
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    foreign: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(echo_url) else foreign.append(r.url))

    await expect(page.locator("#env-name")).to_have_text("EchoEnvironment")
    await expect(page.locator("#env-description")).to_contain_text("Echoes every message back")
    await expect(page).to_have_title("EchoEnvironment · openenv")
    await expect(page.get_by_role("button", name="Step")).to_be_disabled()  # no episode yet

    await reset(page, episode_id="demo")
    await expect(page.locator("#done")).to_have_text("no")
    messages = ["hello", "openenv", "hi"]
    for message in messages:
        await step_echo(page, message)
    await expect(page.locator("#done")).to_have_text("yes")
    await expect(page.locator("#reward")).to_have_text("0.2")
    await expect(page.locator("#total-reward")).to_have_text("1.4")
    await expect(page.locator("#status")).to_have_text(
        "Episode done after 3 steps, total reward 1.4. Press Reset to play again."
    )
    assert await observation(page) == {"echoed_message": "hi", "message_length": 2}
    rows = page.locator("#history tbody tr:not(.detail)")
    await expect(rows.nth(0).locator("th, td")).to_have_text(
        ["1", '{"message":"hello"}', "0.5", "no"]
    )
    await expect(rows.locator("td:nth-child(3)")).to_have_text(["0.5", "0.7", "0.2"])
    await expect(rows.locator("td:nth-child(4)")).to_have_text(["no", "no", "yes"])
    await expect(rows.locator("td:nth-child(2)")).to_have_text(
        [json.dumps({"message": m}, separators=(",", ":")) for m in messages]
    )
    await expect(page.locator("#state")).to_contain_text('"step_count": 3')
    assert await state(page) == {"episode_id": "demo", "step_count": 3}

    # A new episode starts from a clean slate.
    await reset(page, episode_id="again")
    await expect(rows).to_have_count(0)
    assert await state(page) == {"episode_id": "again", "step_count": 0}
    await step_echo(page, "abc")
    await expect(page.locator("#history tbody th")).to_have_text(["1"])
    assert problems == []
    assert foreign == []  # nothing from any other origin: no CDN, no fonts


async def test_screenshot_of_an_episode_for_the_readme(
    echo_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(echo_url)
    await reset(page, episode_id="demo")
    for message in ["hello", "openenv", "hi"]:
        await step_echo(page, message)
    await expect(page.locator("#done")).to_have_text("yes")
    image = await page.screenshot(animations="disabled", caret="hide")
    assert await changed_pixels(page, image, image) == 0
    await keep_screenshot(page, image, SCREENSHOT)


async def test_every_tab_has_its_own_session(new_page: Callable[..., Awaitable[Page]]) -> None:
    with run_server(echo_app(max_steps=50)) as url:
        first = await new_page(url)
        second = await new_page(url)  # another browser context
        third = await first.context.new_page()  # another tab in the first context
        await third.goto(f"{url}/web")
        # A hidden tab gets no animation frames, which Playwright's actions wait for.
        for number, page in enumerate((first, second, third)):
            await page.bring_to_front()
            await reset(page, episode_id=f"tab-{number}")
        await first.bring_to_front()
        await step_echo(first, "one")
        await step_echo(first, "two")
        await step_echo(second, "three")
        await expect(first.locator("#state")).to_contain_text('"step_count": 2')
        await expect(second.locator("#state")).to_contain_text('"step_count": 1')
        assert await state(first) == {"episode_id": "tab-0", "step_count": 2}
        assert await state(second) == {"episode_id": "tab-1", "step_count": 1}
        assert await state(third) == {"episode_id": "tab-2", "step_count": 0}
        assert (await observation(second))["echoed_message"] == "three"
        assert await active_sessions(url) == 3
        await third.close(run_before_unload=True)
        await wait_for_sessions(url, 2)  # closing a tab frees its slot
        await first.context.close()
        await second.context.close()
        await wait_for_sessions(url, 0)


# -- the form generated from the schema -------------------------------------------------


async def test_form_has_a_labelled_control_for_every_kind_of_field(
    move_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(move_url)
    await expect(page.locator("#env-name")).to_have_text("MoveEnvironment")
    kinds = {
        "Text": ("input", "text"),
        "Count": ("input", "number"),
        "Scale": ("input", "number"),
        "Loud": ("input", "checkbox"),
        "Color": ("select", ""),
        "Mode": ("select", ""),
        "Tags": ("textarea", ""),
        "Target": ("textarea", ""),
        "Note": ("input", "text"),
        "Limit": ("input", "number"),
        "Shade": ("select", ""),
        "Flag": ("select", ""),
    }
    for label, (tag, kind) in kinds.items():
        control = page.get_by_label(label)
        await expect(control).to_have_id(f"action-{label.lower()}")
        assert await control.evaluate("e => e.tagName.toLowerCase()") == tag, label
        if kind:
            await expect(control).to_have_attribute("type", kind)
    await expect(page.get_by_label("Count")).to_have_value("1")
    await expect(page.get_by_label("Count")).to_have_attribute("min", "0")
    await expect(page.get_by_label("Count")).to_have_attribute("max", "10")
    await expect(page.get_by_label("Color")).to_have_value("0")
    await expect(page.locator("#action-color option")).to_have_text(["red", "green"])
    await expect(page.locator("#action-mode option")).to_have_text(["walk", "run"])
    await expect(page.locator("#action-shade option")).to_have_text(["— null —", "red", "green"])
    await expect(page.locator("#action-flag option")).to_have_text(["— null —", "true", "false"])
    await expect(page.get_by_label("Text")).to_have_attribute("aria-required", "true")
    await expect(page.locator("#action-text-help")).to_have_text(
        "Anything to say; 'boom' makes step() raise."
    )
    unlabelled = await page.evaluate(
        "[...document.querySelectorAll('input, select, textarea')]"
        ".filter(e => e.labels.length === 0).map(e => e.id)"
    )
    assert unlabelled == []


async def test_form_values_reach_the_environment_as_typed(
    move_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(move_url)
    await reset(page)
    await page.get_by_label("Text").fill("go")
    await page.get_by_label("Count").fill("3")
    await page.get_by_label("Scale").fill("0.5")
    await page.get_by_label("Loud").check()
    await page.get_by_label("Color").select_option(label="green")
    await page.get_by_label("Mode").select_option(label="run")
    await page.get_by_label("Tags").fill('["a", "b"]')
    await page.get_by_label("Target").fill('{"x": 4}')
    await page.get_by_label("Limit").fill("7")
    await page.get_by_label("Flag").select_option(label="false")
    await page.get_by_label("Loud").press("Enter")  # Enter steps from any control, not only text
    await idle(page)
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(1)
    assert (await observation(page))["action"] == {
        "text": "go",
        "count": 3,
        "scale": 0.5,
        "loud": True,
        "color": "green",
        "mode": "run",
        "tags": ["a", "b"],
        "target": {"x": 4, "y": 0},
        "note": None,
        "limit": 7,
        "shade": None,
        "flag": False,
    }
    await expect(page.locator("#reward")).to_have_text("1.5")
    sent = json.loads(await page.locator("#history tbody td code").inner_text())
    assert sent == {
        "text": "go",
        "count": 3,
        "scale": 0.5,
        "loud": True,
        "color": "green",
        "mode": "run",
        "tags": ["a", "b"],
        "target": {"x": 4},
        "limit": 7,
        "flag": False,
    }  # empty optional fields are left out, so the server applies their defaults


# -- errors shown in the page -------------------------------------------------------------


async def test_validation_error_is_shown_next_to_the_field(
    move_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(move_url)
    await reset(page)
    await page.get_by_label("Text").fill("go")
    await page.get_by_label("Count").fill("-1")
    await page.get_by_label("Target").fill('{"x": "left"}')
    await page.get_by_role("button", name="Step").click()

    count_error = page.locator("#action-count-error")
    await expect(count_error).to_be_visible()
    await expect(count_error).to_have_text("Input should be greater than or equal to 0")
    await expect(page.get_by_label("Count")).to_have_attribute("aria-invalid", "true")
    await expect(page.get_by_label("Count")).to_be_focused()
    await expect(page.locator("#action-target-error")).to_have_text(
        "x: Input should be a valid integer, unable to parse string as an integer"
    )
    await expect(page.locator("#action-text-error")).to_be_hidden()
    await expect(page.locator("#error")).to_contain_text("VALIDATION_ERROR: invalid action")
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(0)

    # The session goes on: fix the fields and step.
    await page.get_by_label("Count").fill("2")
    await expect(count_error).to_be_hidden()  # editing a field clears its error
    await page.get_by_label("Target").fill('{"x": 1}')
    await page.get_by_role("button", name="Step").click()
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(1)
    await expect(page.locator("#error")).to_be_hidden()
    await expect(page.locator("#action-target-error")).to_be_hidden()

    # A bad reset argument is shown next to its field too.
    await page.get_by_label("Seed").fill("1.5")
    await page.get_by_role("button", name="Reset").click()
    await expect(page.locator("#reset-seed-error")).to_have_text(
        "Input should be a valid integer, got a number with a fractional part"
    )
    await expect(page.get_by_label("Seed")).to_have_attribute("aria-invalid", "true")
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(
        1
    )  # the episode was not reset


async def test_bad_json_is_caught_in_the_browser(
    move_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(move_url)
    steps_sent: list[str] = []
    page.on(
        "websocket",
        lambda ws: ws.on(
            "framesent", lambda f: steps_sent.append(f) if '"type":"step"' in str(f) else None
        ),
    )
    await reset(page)
    await page.get_by_label("Text").fill("go")
    await page.get_by_label("Tags").fill('["a",')
    await page.get_by_label("Target").fill("[1, 2]")
    await page.get_by_role("button", name="Step").click()
    await expect(page.locator("#action-tags-error")).to_contain_text("Not valid JSON")
    await expect(page.locator("#action-target-error")).to_have_text(
        'Expected a JSON object, like {"key": 1}.'
    )
    await expect(page.locator("#status")).to_have_text("Fix the highlighted fields.")
    await page.get_by_label("Tags").fill('"a"')
    await page.get_by_label("Target").fill("")
    await page.get_by_role("button", name="Step").click()
    await expect(page.locator("#action-tags-error")).to_have_text(
        "Expected a JSON array, like [1, 2]."
    )
    assert steps_sent == []  # nothing invalid went to the server
    await page.get_by_label("Tags").fill('["a"]')
    await page.get_by_label("Tags").press("Enter")  # a newline in a JSON box, not a step
    await expect(page.get_by_label("Tags")).to_have_value('["a"]\n')
    await page.get_by_label("Tags").press("Control+Enter")
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(1)
    assert len(steps_sent) == 1


async def test_environment_error_is_shown_and_the_session_goes_on(
    move_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(move_url)
    await reset(page)
    await page.get_by_label("Text").fill("boom")
    await page.get_by_role("button", name="Step").click()
    await expect(page.locator("#error")).to_have_text(
        "EXECUTION_ERROR: step() raised EnvError: boom"
    )
    await page.get_by_label("Text").fill("fine")
    await page.get_by_role("button", name="Step").click()
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(1)
    await expect(page.locator("#error")).to_be_hidden()
