"""The page at ``/web``, played in a real Chromium against real uvicorn servers."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright, expect
from pydantic import BaseModel, Field
from tcp_proxy import TcpProxy

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import (
    Action,
    ConcurrencyConfig,
    EnvError,
    Environment,
    Observation,
    State,
    create_app,
)
from openenv.testing import run_server

# Debian's Chromium; Playwright never downloads a browser (see PLATFORM-NOTES.md).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # as root the sandbox cannot be used
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}
SCREENSHOT = Path(__file__).parents[1] / "docs" / "web.png"

# Generous: the machine is shared, and expect() returns as soon as the page matches.
expect.set_options(timeout=15_000)

# Every test here shares the browser, so all of them run on the session's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")


# -- an environment whose action has every kind of field ---------------------------


class Color(StrEnum):
    RED = "red"
    GREEN = "green"


class Point(BaseModel):
    x: int
    y: int = 0


class Move(Action):
    """One move, with a field of every kind the form knows."""

    text: str = Field(description="Anything to say; 'boom' makes step() raise.")
    count: int = Field(default=1, ge=0, le=10)
    scale: float = 1.0
    loud: bool = False
    color: Color = Color.RED
    mode: Literal["walk", "run"] = "walk"
    tags: list[str] = Field(default_factory=list)
    target: Point | None = None
    note: str | None = None
    limit: int | None = None
    shade: Color | None = None
    flag: bool | None = None


class Moved(Observation):
    action: dict[str, Any]


class MoveEnvironment(Environment[Move, Moved, State]):
    """Returns every action it is sent, as the server parsed it."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Moved:
        self._state = State(episode_id=episode_id or f"seed-{seed}")
        return Moved(action={})

    def step(self, action: Move, **kwargs: Any) -> Moved:
        if action.text == "boom":
            raise EnvError("boom")
        self._state.step_count += 1
        return Moved(action=action.model_dump(mode="json"), reward=action.count * action.scale)

    @property
    def state(self) -> State:
        return self._state


def echo_app(max_envs: int = 8, max_steps: int = 3) -> Any:
    factory = functools.partial(EchoEnvironment, max_steps=max_steps)
    return create_app(
        factory, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=max_envs)
    )


# -- fixtures and helpers --------------------------------------------------------------


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the whole test session; each test opens its own contexts.

    The async API, on the session's event loop: the sync API would keep its own
    loop marked as running in this thread and break every later asyncio test.
    """
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        await browser.close()


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with run_server(echo_app()) as url:
        yield url


@pytest.fixture(scope="module")
def move_url() -> Iterator[str]:
    app = create_app(MoveEnvironment, Move, Moved, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def new_page(browser: Browser) -> AsyncIterator[Callable[..., Awaitable[Page]]]:
    """Open ``/web`` of a server in a fresh browser context (a fresh tab, its own session)."""
    contexts = []

    async def open_page(base_url: str, viewport: dict[str, int] = WIDE, query: str = "") -> Page:
        context = await browser.new_context(viewport=viewport)
        context.set_default_timeout(15_000)
        contexts.append(context)
        page = await context.new_page()
        await page.goto(f"{base_url}/web{query}")
        return page

    yield open_page
    for context in contexts:
        await context.close()


async def idle(page: Page) -> None:
    """Wait until the page's exchange (and the state refresh after it) is over.

    The buttons are disabled from the click until the last reply is in.
    """
    await expect(page.get_by_role("button", name="Reset")).to_be_enabled()


async def reset(page: Page, episode_id: str | None = None) -> None:
    if episode_id is not None:
        await page.get_by_label("Episode id").fill(episode_id)
    await page.get_by_role("button", name="Reset").click()
    await idle(page)
    await expect(page.locator("#status")).to_have_text(
        "Episode started: fill in the action and press Step."
    )


async def step_echo(page: Page, message: str) -> None:
    rows = await page.locator("#history tbody tr:not(.detail)").count()
    await page.get_by_label("Message").fill(message)
    await page.get_by_role("button", name="Step").click()
    await idle(page)
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(rows + 1)


async def observation(page: Page) -> Any:
    return json.loads(await page.locator("#observation").inner_text())


async def state(page: Page) -> Any:
    return json.loads(await page.locator("#state").inner_text())


async def active_sessions(url: str) -> int:
    async with httpx.AsyncClient() as http:
        value: int = (await http.get(f"{url}/health")).json()["active_sessions"]
    return value


async def wait_for_sessions(url: str, count: int) -> None:
    deadline = time.monotonic() + 15
    while (active := await active_sessions(url)) != count:
        assert time.monotonic() < deadline, f"expected {count} active sessions, got {active}"
        await asyncio.sleep(0.02)  # polling a condition with a deadline


async def changed_pixels(page: Page, before: bytes, after: bytes) -> int:
    """How many pixels of two PNGs differ clearly, decoded by the browser itself."""
    count: int = await page.evaluate(
        """async ([before, after]) => {
            const pixels = async (b64) => {
                const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
                const bitmap = await createImageBitmap(new Blob([bytes], { type: "image/png" }));
                const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
                const context = canvas.getContext("2d");
                context.drawImage(bitmap, 0, 0);
                return context.getImageData(0, 0, bitmap.width, bitmap.height);
            };
            const [a, b] = await Promise.all([pixels(before), pixels(after)]);
            if (a.width !== b.width || a.height !== b.height) return a.width * a.height;
            let changed = 0;
            for (let i = 0; i < a.data.length; i += 4) {
                let delta = 0;
                for (let c = i; c < i + 3; c += 1) delta += Math.abs(a.data[c] - b.data[c]);
                if (delta > 96) changed += 1;
            }
            return changed;
        }""",
        [base64.b64encode(before).decode(), base64.b64encode(after).decode()],
    )
    return count


async def no_horizontal_overflow(page: Page) -> bool:
    overflow: bool = await page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )
    return overflow


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
    # Anti-aliasing varies by a few pixels from run to run: rewrite the picture
    # only when the page looks different, so a test run leaves git clean.
    if not SCREENSHOT.exists() or await changed_pixels(page, SCREENSHOT.read_bytes(), image) > 100:
        SCREENSHOT.parent.mkdir(exist_ok=True)
        SCREENSHOT.write_bytes(image)


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


# -- the connection ---------------------------------------------------------------------


async def test_full_server_shows_the_capacity_message(
    new_page: Callable[..., Awaitable[Page]],
) -> None:
    with run_server(echo_app(max_envs=1)) as url:
        first = await new_page(url)
        await reset(first)
        second = await new_page(url)
        banner = second.locator("#connection-banner")
        await expect(banner).to_contain_text("Server at capacity, try again")
        await expect(banner).to_contain_text("all 1 sessions are in use")
        await expect(second.locator("#status")).to_have_text("Server at capacity.")
        await expect(second.get_by_role("button", name="Reset")).to_be_disabled()
        assert await active_sessions(url) == 1

        await first.context.close()
        await wait_for_sessions(url, 0)
        await second.get_by_role("button", name="Try again").click()
        await expect(banner).to_be_hidden()
        await reset(second)
        await step_echo(second, "room now")


async def test_dropped_socket_offers_reconnect(
    echo_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    with TcpProxy(echo_url) as proxy:
        page = await new_page(proxy.url)
        await reset(page)
        await step_echo(page, "before")
        assert proxy.cut() >= 1
        banner = page.locator("#connection-banner")
        await expect(banner).to_contain_text("The connection to the server was lost")
        await expect(page.locator("#status")).to_have_text("Disconnected.")
        await expect(page.get_by_role("button", name="Step")).to_be_disabled()
        await expect(page.get_by_role("button", name="Reset")).to_be_disabled()

        await page.get_by_role("button", name="Reconnect").click()
        await expect(page.locator("#status")).to_have_text(
            "Connected: a new session. Press Reset to start an episode."
        )
        await expect(banner).to_be_hidden()
        await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(0)
        await expect(page.get_by_role("button", name="Reset")).to_be_focused()
        await reset(page)
        await step_echo(page, "after")
        assert (await state(page))["step_count"] == 1  # a fresh environment


async def test_server_closing_the_session_says_why(
    new_page: Callable[..., Awaitable[Page]],
) -> None:
    app = create_app(
        EchoEnvironment,
        EchoAction,
        EchoObservation,
        ConcurrencyConfig(session_timeout=0.2),
        reap_interval=0.05,
    )
    with run_server(app) as url:
        page = await new_page(url)
        await expect(page.locator("#connection-banner")).to_contain_text(
            "Disconnected: session closed after being idle too long."
        )
        await expect(page.get_by_role("button", name="Reconnect")).to_be_visible()


# -- keyboard and layout -------------------------------------------------------------------


async def test_keyboard_alone_plays(
    echo_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(echo_url)
    await expect(page.get_by_role("button", name="Reset")).to_be_enabled()
    await page.locator("body").focus()
    for _ in range(15):  # Tab reaches Reset within a few presses
        await page.keyboard.press("Tab")
        if await page.evaluate("document.activeElement.id") == "reset":
            break
    await expect(page.get_by_role("button", name="Reset")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator("#status")).to_have_text(
        "Episode started: fill in the action and press Step."
    )
    await idle(page)
    await expect(
        page.get_by_role("button", name="Reset")
    ).to_be_focused()  # focus survives the exchange
    await page.keyboard.press("Tab")
    await expect(page.get_by_label("Message")).to_be_focused()
    await page.keyboard.type("typed")
    await page.keyboard.press("Enter")  # Enter in the form steps
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(1)
    await idle(page)
    assert (await observation(page))["echoed_message"] == "typed"
    await page.keyboard.press("Tab")
    await expect(page.get_by_role("button", name="Step")).to_be_focused()
    await page.keyboard.press("Space")
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(2)
    await idle(page)
    await page.get_by_label("Seed").press("Enter")  # Enter in the reset form resets
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(0)


@pytest.mark.parametrize("viewport", [NARROW, WIDE], ids=["390px", "1280px"])
async def test_no_horizontal_overflow(
    viewport: dict[str, int], echo_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(echo_url, viewport=viewport)
    await reset(page)
    await step_echo(page, "x" * 300)  # one long unbroken word in the observation, state and history
    await step_echo(page, "a much longer message, " * 12)
    await expect(page.locator("#reward")).to_have_text("27.6")
    assert await no_horizontal_overflow(page)
    assert await page.get_by_role("button", name="Step").is_visible()


async def test_page_plays_on_a_server_with_an_api_key(
    new_page: Callable[..., Awaitable[Page]],
) -> None:
    factory = functools.partial(EchoEnvironment, max_steps=3)
    app = create_app(factory, EchoAction, EchoObservation, api_key="page-key")
    with run_server(app) as url:
        refused = await new_page(url)  # no key: the page loads but says what it needs
        await expect(refused.locator("#error")).to_contain_text("needs an API key")
        page = await new_page(url, query="?api_key=page-key")
        await expect(page.locator("#env-name")).to_have_text("EchoEnvironment")
        await reset(page)
        await step_echo(page, "secret")
        assert await observation(page) == {"echoed_message": "secret", "message_length": 6}
