"""``/web`` against the hard shapes real schemas and observations take, in real Chromium.

An action whose fields have non-empty defaults, names like JavaScript's own
(``__proto__``, ``constructor``), integers past 2**53, unions, tuples and
unicode titles; observations of every awkward shape; long episodes; a split
of 100,000 tasks; a tool with the same argument shapes.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from enum import IntEnum, StrEnum
from typing import Annotated, Any, Literal

import pytest
from playwright.async_api import Page, Route, expect
from pydantic import BaseModel, ConfigDict, Field
from web_page_kit import (
    idle,
    observation,
    reset,
    reset_first_offered,
    reset_position,
    watch_reset,
)

from openenv import (
    Action,
    ConcurrencyConfig,
    Environment,
    Observation,
    State,
    TaskSpec,
    ToolOutput,
    create_app,
    tool,
)
from openenv.testing import run_server

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Level(IntEnum):
    LOW = 1
    HIGH = 2


class Shade(StrEnum):
    RED = "red"
    GREEN = "green"


class Cat(BaseModel):
    kind: Literal["cat"] = "cat"
    meows: int


class Dog(BaseModel):
    kind: Literal["dog"] = "dog"
    barks: bool


class Shapes(Action):
    """Every field has a default, most of them not empty."""

    show: str = Field(default="", description="An observation shape to send back.")
    level: Level = Level.LOW
    pet: Annotated[Cat | Dog, Field(discriminator="kind")] | None = None
    pair: tuple[int, int] = (0, 0)
    weights: dict[str, float] = {}
    limit: int | None = 5
    shade: Shade | None = Shade.RED
    note: str | None = "hi"
    greeting: str = "hello"
    size: int = Field(default=0, alias="__proto__")
    constructor: int = 0
    big: int = Field(default=0, title="Größe 📏")
    heading: int = 0  # its input's id would be the page's own "action-heading"
    stdin: str | None = ""  # its box shows the default as it shows null: empty
    op: Literal["", "add"] = "add"  # a choice of the empty string


class Anything(Observation):
    model_config = ConfigDict(extra="allow")


def shape(name: str) -> dict[str, Any]:
    """Observation fields of a named awkward shape."""
    if name == "proto":
        return {"__proto__": {"polluted": True}, "constructor": "c"}
    if name == "players":  # short strings as long as a name: a table, not letter tiles
        return {"players": [{"name": "ann", "cards": ["2H", "3D", "KS"]}]}
    if name == "numbers":
        return {"numbers": [i * 0.1 for i in range(10_000)]}
    if name == "huge":  # 3,000,000 characters: a web page's HTML, a long log
        return {"page": "<p>a line</p>\n" * 214_286}
    if name == "nulls":
        return {"a": None, "b": [None], "c": {"x": None}, "d": [{"k": None}]}
    if name == "metadata":
        return {"metadata": {"event": "toss", "turn": 2}, "side": "heads"}
    return {}


class Tasks(Sequence[TaskSpec]):
    """100,000 tasks, made on demand."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not 0 <= index < len(self):
            raise IndexError(index)
        return TaskSpec(id=f"task-{index:05d}", prompt=f"Task number {index}.")


class ShapesEnvironment(Environment[Shapes, Anything, State]):
    """Returns the action it parsed, with extra fields of the shape it names."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State()

    @classmethod
    def list_splits(cls) -> Sequence[str]:
        return ("all",)

    @classmethod
    def list_tasks(cls, split: str) -> Sequence[TaskSpec]:
        return Tasks()

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task: TaskSpec | None = None,
        **kw: Any,
    ) -> Anything:
        self._state = State(episode_id=episode_id or f"seed-{seed}")
        return Anything(seed=seed, task=None if task is None else task.id)

    def step(self, action: Shapes, **kwargs: Any) -> Anything:
        self._state.step_count += 1
        sent = action.model_dump(mode="json", by_alias=True)
        reward = 123456789012345.0 if action.show == "big reward" else 0.1
        return Anything(action=sent, reward=reward, **shape(action.show))

    @tool
    def configure(self, limit: int | None = 5, label: str = "x") -> ToolOutput:
        """Echo the arguments as Python received them."""
        return ToolOutput.wrap({"limit": limit, "label": label})

    @property
    def state(self) -> State:
        return self._state


@pytest.fixture(scope="module")
def shapes_url() -> Iterator[str]:
    app = create_app(ShapesEnvironment, Shapes, Anything, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        yield url


async def step(page: Page) -> None:
    rows = await page.locator("#history tbody tr:not(.detail)").count()
    await page.get_by_role("button", name="Step").click()
    await idle(page)
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(rows + 1)


def field(page: Page, name: str) -> Any:
    return page.locator(f'#action-fields [name="{name}"]')


def action(page: Page, label: str) -> Any:
    """The action form's control labelled ``label`` (a tool's form may have one alike)."""
    return page.locator("#action-form").get_by_label(label)


# -- the form ----------------------------------------------------------------------------


async def test_a_cleared_field_sends_empty_not_its_default(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    await reset(page)
    await expect(action(page, "Limit")).to_have_value("5")
    await expect(page.locator("label[for=action-limit]")).to_contain_text("or empty for null")
    await action(page, "Limit").fill("")
    await action(page, "Note").fill("")
    await action(page, "Greeting").fill("")
    await action(page, "Shade").select_option(label="— null —")
    await step(page)
    sent = (await observation(page))["action"]
    # What the hint promises: empty is null for an Optional field, "" for a string.
    assert (sent["limit"], sent["note"], sent["shade"], sent["greeting"]) == (None, None, None, "")

    # Left as they are, the defaults are sent (or left to the server): nothing changes.
    page = await new_page(shapes_url)
    await reset(page)
    await step(page)
    sent = (await observation(page))["action"]
    assert (sent["limit"], sent["note"], sent["shade"], sent["greeting"]) == (
        5,
        "hi",
        "red",
        "hello",
    )


async def test_an_optional_text_field_whose_default_is_empty_sends_it_untouched(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    await reset(page)
    await expect(action(page, "Stdin")).to_have_value("")
    await step(page)
    assert (await observation(page))["action"]["stdin"] == ""
    # Typed in, then emptied: what the hint says, null.
    await action(page, "Stdin").fill("x")
    await action(page, "Stdin").fill("")
    await step(page)
    assert (await observation(page))["action"]["stdin"] is None


async def test_a_choice_of_the_empty_string_is_shown_and_sent(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    await reset(page)
    await expect(page.locator("#action-op option")).to_have_text(['""', "add"])
    await action(page, "Op").select_option(label='""')
    await step(page)
    assert (await observation(page))["action"]["op"] == ""


async def test_hard_field_shapes_are_sent_typed(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    await reset(page)
    await expect(page.locator("label[for=action-big]")).to_contain_text("Größe 📏")
    await action(page, "Level").select_option(label="2")
    await action(page, "Pet").fill('{"kind": "dog", "barks": true}')
    await action(page, "Pair").fill("[3, 4]")
    await action(page, "Weights").fill('{"a": 0.25}')
    await field(page, "__proto__").fill("7")  # pydantic's alias, a name JavaScript treats specially
    await field(page, "constructor").fill("8")
    await step(page)
    sent = (await observation(page))["action"]
    assert sent["level"] == 2
    assert sent["pet"] == {"kind": "dog", "barks": True}
    assert sent["pair"] == [3, 4]
    assert sent["weights"] == {"a": 0.25}
    assert (sent["__proto__"], sent["constructor"]) == (7, 8)
    request = json.loads(await page.locator("#history tbody td code").last.inner_text())
    assert request["__proto__"] == 7

    # A server-side error on a nested field lands next to its field.
    await action(page, "Pet").fill('{"kind": "cat", "meows": "loud"}')
    await page.get_by_role("button", name="Step").click()
    await expect(page.locator("#action-pet-error")).to_contain_text("meows")
    await expect(action(page, "Pet")).to_have_attribute("aria-invalid", "true")


async def test_a_field_named_like_a_part_of_the_page_is_still_labelled(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    await reset(page)
    await action(page, "Heading").fill("90")
    await step(page)
    assert (await observation(page))["action"]["heading"] == 90
    duplicated = await page.evaluate(
        "(() => { const ids = [...document.querySelectorAll('[id]')].map(e => e.id);"
        " return ids.filter((id, i) => ids.indexOf(id) !== i); })()"
    )
    assert duplicated == []


async def test_an_integer_too_large_for_the_browser_is_refused_not_rounded(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    sent: list[str] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda f: sent.append(str(f))))
    # 2**53 + 1: a browser number would silently become 2**53.
    await page.get_by_label("Seed").fill("9007199254740993")
    await page.get_by_role("button", name="Reset").click()
    await expect(page.locator("#reset-seed-error")).to_contain_text("Too large")
    await page.get_by_label("Seed").fill("9007199254740991")
    await reset(page)
    assert (await observation(page))["seed"] == 9007199254740991

    await field(page, "big").fill("9007199254740993")
    await page.get_by_role("button", name="Step").click()
    await expect(page.locator("#action-big-error")).to_contain_text("Too large")
    assert not any('"type":"step"' in frame for frame in sent)


async def test_a_tool_argument_cleared_is_null(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    await reset(page)
    card = page.get_by_role("form", name="Tool configure")
    await expect(card.get_by_label("Limit")).to_have_value("5")
    await card.get_by_label("Limit").fill("")
    await card.get_by_label("Label").fill("")
    await card.get_by_role("button", name="Call configure").click()
    await expect(card.locator(".tool-result pre")).to_have_text(
        json.dumps({"limit": None, "label": ""}, indent=2)
    )


# -- what comes back ------------------------------------------------------------------------


async def test_awkward_observations_are_shown_whole(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    await reset(page)

    await action(page, "Show").fill("proto")
    await step(page)
    shown = await observation(page)
    assert shown["__proto__"] == {"polluted": True}
    assert shown["constructor"] == "c"

    await action(page, "Show").fill("players")
    await step(page)
    table = page.locator("#views table", has_text="players")
    await expect(table).to_have_class("view records")
    await expect(table.locator("tbody td")).to_have_text(["ann", "2H 3D KS"])

    await action(page, "Show").fill("nulls")
    await step(page)
    assert {k: v for k, v in (await observation(page)).items() if k != "action"} == shape("nulls")

    await action(page, "Show").fill("big reward")
    await step(page)
    await expect(page.locator("#reward")).to_have_text("123456789012345")
    await expect(page.locator("#history tbody td:nth-child(3)").last).to_have_text(
        "123456789012345"
    )
    assert problems == []


async def test_an_observations_metadata_is_shown_once_after_its_fields_not_as_a_view(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    # The metadata travels among the observation's fields too now: the page
    # showed it as one of them (a table among the views, first in the JSON).
    page = await new_page(shapes_url)
    await reset(page)
    await action(page, "Show").fill("metadata")
    await step(page)
    shown = await observation(page)
    assert list(shown)[-1] == "metadata"
    assert shown["metadata"] == {"event": "toss", "turn": 2}
    assert shown["side"] == "heads"
    await expect(page.locator("#views")).to_contain_text("heads")
    await expect(page.locator("#views")).not_to_contain_text("toss")


async def test_a_long_episode_keeps_no_second_copy_of_every_reply(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    await reset(page)
    await action(page, "Show").fill("numbers")  # 10,000 numbers a step
    for _ in range(12):
        await step(page)
    assert len((await observation(page))["numbers"]) == 10_000
    # The history is a row a step; a reply is written out only when its row is opened.
    history = page.locator("#history")
    size = await history.evaluate("table => table.textContent.length")
    assert size < 12 * 500, size
    rows = page.locator("#history tbody tr:not(.detail)")
    await rows.nth(3).get_by_role("button").click()
    detail = page.locator("#history tr.detail").nth(3)
    await expect(detail).to_be_visible()
    assert len(json.loads(await detail.inner_text())["observation"]["numbers"]) == 10_000


async def test_a_huge_observation_is_shown_cut_and_kept_whole(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    await reset(page)
    await action(page, "Show").fill("huge")
    await step(page)
    whole = len(shape("huge")["page"])
    # Laid out whole, each copy of it would hold the tab for seconds.
    await expect(page.locator("#views pre")).to_contain_text(
        f"… {whole - 1_000_000:,} more characters"
    )
    await expect(page.locator("#observation")).to_contain_text(
        re.compile(r"… [\d,]+ more characters")
    )
    for shown in (page.locator("#views pre"), page.locator("#observation")):
        assert await shown.evaluate("e => e.textContent.length") < 1_001_000
    await page.locator("#history tbody tr:not(.detail)").last.get_by_role("button").click()
    detail = page.locator("#history tr.detail").last
    await expect(detail).to_be_visible()
    assert json.loads(await detail.inner_text())["observation"]["page"] == shape("huge")["page"]


# -- tasks ------------------------------------------------------------------------------------


async def test_any_of_100000_tasks_can_be_played(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(shapes_url)
    await expect(page.locator("#task-count")).to_have_text(
        "100000 tasks in all (the first 200 of 100000)"
    )
    number = page.get_by_label("Task number")
    await number.fill("100000")
    await page.get_by_role("button", name="Reset").click()
    await expect(page.locator("#task-number-error")).to_have_text(
        "Enter a whole number from 0 to 99999."
    )
    await number.fill("54321")
    await reset(page)
    await expect(page.get_by_label("Task prompt")).to_have_text("Task number 54321.")
    assert (await observation(page))["task"] == "task-54321"

    # Choosing from the list clears the number, and the list's task is played.
    await page.get_by_label("Task", exact=True).select_option(label="task-00007")
    await expect(number).to_have_value("")
    await reset(page)
    assert (await observation(page))["task"] == "task-00007"


async def test_reset_is_offered_only_once_the_task_list_has_stopped_moving_it(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    # The task list arriving grows the picker above Reset and moves the button
    # (here to the next line): a click on its way to it as it moved was lost,
    # the tab left at "Connected". The list is held until the session is open.
    held: asyncio.Queue[Route] = asyncio.Queue()

    async def prepare(page: Page) -> None:
        await watch_reset(page)
        await page.route(re.compile(r"/tasks\?split="), held.put)

    page = await new_page(shapes_url, prepare=prepare)
    await expect(page.locator("#status")).to_have_text(
        "Connected: a new session. Press Reset to start an episode."
    )
    await (await held.get()).continue_()
    await expect(page.locator("#task-count")).to_have_text(
        "100000 tasks in all (the first 200 of 100000)"
    )
    await expect(page.get_by_label("Task number")).to_be_visible()
    await idle(page)
    assert await reset_first_offered(page) == await reset_position(page)
    await reset(page)


async def test_a_task_list_that_never_comes_does_not_hold_reset(
    shapes_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    # Reset waits for the task list; a listing the server never answers (user code
    # that hangs) must end as a failed one, leaving Reset to play without a task.
    held: asyncio.Queue[Route] = asyncio.Queue()

    async def prepare(page: Page) -> None:
        await page.clock.install()  # the page's timers run when the test says
        await page.route(re.compile(r"/tasks\?split="), held.put)

    page = await new_page(shapes_url, prepare=prepare)
    await held.get()  # and never answered
    await expect(page.locator("#status")).to_have_text(
        "Connected: a new session. Press Reset to start an episode."
    )
    await expect(page.get_by_role("button", name="Reset")).to_be_disabled()
    await page.clock.run_for(10_000)
    await expect(page.locator("#task-count")).to_have_text(
        re.compile(r"^Could not list the tasks of .*: GET tasks\?split=.* had no answer in 10 s$")
    )
    await reset(page)
    assert (await observation(page))["task"] is None  # the environment chose
