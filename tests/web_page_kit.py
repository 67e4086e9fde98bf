"""Shared pieces of the ``/web`` browser tests: Chromium, servers, a rich action, helpers.

The test modules that drive the page build their fixtures from `chromium()` and
`page_opener()`, and import its helpers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import httpx
from playwright.async_api import Browser, Page, async_playwright, expect
from pydantic import BaseModel, Field

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


# -- what the fixtures of the test modules are made of -------------------------------------
# (Each test module declares its fixtures itself, from these, so pytest's assertion
# rewriting and ruff both see plain imports.)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A headless Chromium; each test opens its own contexts in it.

    The async API, on the session's event loop: the sync API would keep its own
    loop marked as running in this thread and break every later asyncio test.
    """
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        await browser.close()


def move_app() -> Any:
    return create_app(MoveEnvironment, Move, Moved, ConcurrencyConfig(max_concurrent_envs=4))


@contextlib.asynccontextmanager
async def page_opener(browser: Browser) -> AsyncIterator[Callable[..., Awaitable[Page]]]:
    """Open ``/web`` of a server in a fresh browser context (a fresh tab, its own session)."""
    contexts = []

    async def open_page(
        base_url: str,
        viewport: dict[str, int] = WIDE,
        query: str = "",
        prepare: Callable[[Page], Awaitable[None]] | None = None,
    ) -> Page:
        """``prepare`` runs before the page loads: routes, init scripts."""
        context = await browser.new_context(viewport=viewport)
        context.set_default_timeout(15_000)
        contexts.append(context)
        page = await context.new_page()
        if prepare is not None:
            await prepare(page)
        await page.goto(f"{base_url}/web{query}")
        return page

    try:
        yield open_page
    finally:
        for context in contexts:
            await context.close()


# -- helpers ---------------------------------------------------------------------------------


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


# Where the Reset button was the first time it was enabled (null until then), in
# page coordinates. A button enabled and then disabled, or moved, loses a click
# already on its way to it: the press lands on a disabled button, or the release
# beside it.
_WATCH_RESET = """
window.resetFirstOffered = null;
const watcher = new MutationObserver(() => {
  const button = document.getElementById("reset");
  if (!button || button.disabled) return;
  const box = button.getBoundingClientRect();
  window.resetFirstOffered = { x: box.x + scrollX, y: box.y + scrollY };
  watcher.disconnect();
});
watcher.observe(document, {
  subtree: true, childList: true, attributes: true, attributeFilter: ["disabled"],
});
"""


async def watch_reset(page: Page) -> None:
    """Record where Reset is first offered; a ``prepare`` for ``open_page``."""
    await page.add_init_script(_WATCH_RESET)


async def reset_first_offered(page: Page) -> dict[str, float] | None:
    offered: dict[str, float] | None = await page.evaluate("window.resetFirstOffered")
    return offered


async def reset_position(page: Page) -> dict[str, float]:
    position: dict[str, float] = await page.get_by_role("button", name="Reset").evaluate(
        "(button) => { const box = button.getBoundingClientRect();"
        " return { x: box.x + scrollX, y: box.y + scrollY }; }"
    )
    return position


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


async def keep_screenshot(page: Page, image: bytes, path: Path, tolerance: float = 0.01) -> None:
    """Keep ``image`` as the docs' picture at ``path`` if it looks different from the one there.

    Live numbers and anti-aliasing change some pixels from run to run: the file
    is rewritten only past ``tolerance`` (a fraction of its pixels), so a test
    run leaves the checkout clean while the docs still follow the page.
    """
    assert image.startswith(b"\x89PNG\r\n"), "the browser made a PNG"
    width, height = struct.unpack(">II", image[16:24])  # the IHDR chunk
    assert width * height > 0
    kept = _read(path)
    if kept is None or await changed_pixels(page, kept, image) > tolerance * width * height:
        _write(path, image)


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def _write(path: Path, image: bytes) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(image)


async def no_horizontal_overflow(page: Page) -> bool:
    overflow: bool = await page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )
    return overflow
