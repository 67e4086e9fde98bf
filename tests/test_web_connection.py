"""``/web``'s connection (capacity, drops, closes), keyboard, layout and API key, in Chromium."""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from playwright.async_api import Page, expect
from tcp_proxy import TcpProxy
from web_page_kit import (
    NARROW,
    WIDE,
    active_sessions,
    echo_app,
    idle,
    no_horizontal_overflow,
    observation,
    reset,
    reset_first_offered,
    state,
    step_echo,
    wait_for_sessions,
    watch_reset,
)

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import (
    Action,
    ConcurrencyConfig,
    Environment,
    Observation,
    State,
    create_app,
)
from openenv.testing import run_server

# Every test here shares the browser, so all of them run on the session's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with run_server(echo_app()) as url:
        yield url


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


async def test_a_tab_queued_for_a_slot_says_so_until_it_has_one(
    new_page: Callable[..., Awaitable[Page]],
) -> None:
    concurrency = ConcurrencyConfig(max_concurrent_envs=1, queue_timeout=60)
    with run_server(create_app(EchoEnvironment, EchoAction, EchoObservation, concurrency)) as url:
        first = await new_page(url)
        await reset(first)
        # accepted, and in line for the one slot
        second = await new_page(url, prepare=watch_reset)
        status = second.locator("#status")
        await expect(status).to_have_text(
            "Waiting for a free slot: all 1 sessions are in use. "
            "This tab gets the next one that frees up."
        )
        await expect(second.get_by_role("button", name="Reset")).to_be_disabled()
        # Not even for the moment between its socket's open and /health's answer:
        # a click then would land on a button that /health's answer disables.
        assert await reset_first_offered(second) is None
        await expect(second.locator("#connection-banner")).to_be_hidden()

        await first.context.close()  # its slot frees: the queued tab's session opens
        await expect(status).to_have_text(
            "Connected: a new session. Press Reset to start an episode."
        )
        await reset(second)
        await step_echo(second, "my turn")


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


async def test_a_request_too_large_for_the_server_says_so(
    new_page: Callable[..., Awaitable[Page]],
) -> None:
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, max_message_size=1000)
    with run_server(app) as url:
        page = await new_page(url)
        await reset(page)
        await page.get_by_label("Message").fill("x" * 2000)
        await page.get_by_role("button", name="Step").click()
        await expect(page.locator("#connection-banner")).to_contain_text(
            "the last request was larger than it accepts"
        )
        await page.get_by_role("button", name="Reconnect").click()
        await reset(page)
        await step_echo(page, "small")


async def test_a_server_shutting_down_says_so(new_page: Callable[..., Awaitable[Page]]) -> None:
    with run_server(echo_app()) as url:  # plain uvicorn: it closes every socket with 1012
        page = await new_page(url)
        await reset(page)
    await expect(page.locator("#connection-banner")).to_contain_text(
        "The server is shutting down or restarting"
    )


class Stuck(Action):
    pass


class StuckEnvironment(Environment[Stuck, Observation, State]):
    """Its step blocks until the test lets it go: past any step_timeout."""

    released = threading.Event()

    def reset(self, **kwargs: Any) -> Observation:
        return Observation()

    def step(self, action: Stuck, **kwargs: Any) -> Observation:
        self.released.wait(30)
        return Observation()

    @property
    def state(self) -> State:
        return State()


async def test_a_session_closed_for_an_overrunning_step_says_why(
    new_page: Callable[..., Awaitable[Page]],
) -> None:
    app = create_app(StuckEnvironment, Stuck, Observation, step_timeout=0.2)
    with run_server(app) as url:
        try:
            page = await new_page(url)
            await reset(page)
            await page.get_by_role("button", name="Step").click()
            await expect(page.locator("#connection-banner")).to_contain_text(
                "Disconnected: step() did not return within 0.2s"
            )
        finally:
            StuckEnvironment.released.set()  # the step's thread ends before the server does


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
        page = await new_page(url, query="?api_key=page-key&theme=x")
        await expect(page.locator("#env-name")).to_have_text("EchoEnvironment")
        await reset(page)
        await step_echo(page, "secret")
        assert await observation(page) == {"echoed_message": "secret", "message_length": 6}
        # Out of the address bar (copied links), the rest of it kept...
        assert page.url == f"{url}/web?theme=x"
        await page.reload()  # ...and still this tab's after a reload...
        await expect(page.locator("#env-name")).to_have_text("EchoEnvironment")
        await reset(page)
        await step_echo(page, "again")
        assert await observation(page) == {"echoed_message": "again", "message_length": 5}
        await page.go_back()  # ...and not in the history: the entry was replaced
        assert page.url == "about:blank"


async def test_page_plays_with_a_key_that_cannot_be_a_subprotocol(
    new_page: Callable[..., Awaitable[Page]],
) -> None:
    # `openssl rand -base64` keys hold '/', '+' and '=', which a WebSocket
    # subprotocol may not: the browser refuses to open a socket that offers one.
    key = "k3y/with+base64=="
    factory = functools.partial(EchoEnvironment, max_steps=3)
    app = create_app(factory, EchoAction, EchoObservation, api_key=key)
    with run_server(app) as url:
        page = await new_page(url, query=f"?api_key={quote(key, safe='')}")
        await reset(page)
        await step_echo(page, "secret")
        assert await observation(page) == {"echoed_message": "secret", "message_length": 6}
