"""Models with fields JSON Schema cannot describe (a ``numpy.ndarray``, a plain
class), as OpenEnv's ``arbitrary_types_allowed`` models have them: ``/schema``,
``/openapi.json``, ``/docs``, ``/tools``, MCP's tools/list and the web page's
form all answer, the field given a permissive schema naming its type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from mcp import Client
from playwright.async_api import Page, expect
from pydantic import BaseModel, ConfigDict
from web_page_kit import idle, observation, reset

from openenv import Action, Environment, Observation, State, ToolOutput, tool
from openenv import create_app as openenv_create_app
from openenv.core.env_server import types as oe_types
from openenv.core.env_server.http_server import create_app as core_create_app
from openenv.core.env_server.interfaces import Environment as CoreEnvironment
from openenv.runtime import RandomAgent, RunConfig, Runners, Task
from openenv.testing import run_server


class Blob:
    """A plain class: pydantic validates it by isinstance, and has no schema for it."""


ARBITRARY = ConfigDict(arbitrary_types_allowed=True)


class Stroke(BaseModel):
    model_config = ARBITRARY
    width: int = 1
    mask: np.ndarray | None = None


# OpenEnv's models (arbitrary types allowed), served by openenv.core's create_app.
class CorePaint(oe_types.Action):
    brush: int = 0
    mask: np.ndarray | None = None
    handle: Blob | None = None


class CoreCanvas(oe_types.Observation):
    pixels: np.ndarray | None = None
    thing: Blob | None = None
    brush: int = 0


class CorePainter(CoreEnvironment[CorePaint, CoreCanvas, oe_types.State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> CoreCanvas:
        return CoreCanvas()

    def step(self, action: CorePaint, timeout_s: float | None = None, **kwargs: Any) -> CoreCanvas:
        return CoreCanvas(brush=action.brush)

    @property
    def state(self) -> oe_types.State:
        return oe_types.State()

    @tool
    def paint(self, stroke: Stroke) -> ToolOutput:
        """Paint one stroke."""
        return ToolOutput.wrap(stroke.width)


# openenv's own models, with arbitrary types allowed, served by openenv's create_app.
class Paint(Action):
    model_config = ARBITRARY
    brush: int = 0
    mask: np.ndarray | None = None
    handle: Blob | None = None


class Canvas(Observation):
    model_config = ARBITRARY
    pixels: np.ndarray | None = None
    thing: Blob | None = None
    brush: int = 0


class Painter(Environment[Paint, Canvas, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> Canvas:
        return Canvas()

    def step(self, action: Paint) -> Canvas:
        return Canvas(brush=action.brush)

    @property
    def state(self) -> State:
        return State()

    @tool
    def paint(self, stroke: Stroke) -> ToolOutput:
        """Paint one stroke."""
        return ToolOutput.wrap(stroke.width)


APPS: dict[str, Callable[[], Any]] = {
    "openenv.core": lambda: core_create_app(
        CorePainter, CorePaint, CoreCanvas, env_name="paint", max_concurrent_envs=4, mcp=True
    ),
    "openenv": lambda: openenv_create_app(
        Painter, Paint, Canvas, max_concurrent_envs=4, env_name="paint", mcp=True
    ),
}


@pytest.fixture(scope="module", params=list(APPS))
def paint_url(request: pytest.FixtureRequest) -> Iterator[str]:
    with run_server(APPS[request.param]()) as url:
        yield url


def permissive(field: dict[str, Any]) -> dict[str, Any]:
    """The non-null variant of an ``X | None`` field's schema."""
    variants = [v for v in field["anyOf"] if v.get("type") != "null"]
    assert len(variants) == 1, field
    return variants[0]


def test_schema_describes_what_it_can_and_names_what_it_cannot(paint_url: str) -> None:
    with httpx.Client(base_url=paint_url) as http:
        answer = http.get("/schema")
        assert answer.status_code == 200, answer.text
        schema = answer.json()
    action = schema["action"]["properties"]
    assert action["brush"]["type"] == "integer"
    assert permissive(action["mask"])["x-python-type"] == "numpy.ndarray"
    assert permissive(action["handle"])["x-python-type"].endswith("Blob")
    observation = schema["observation"]["properties"]
    assert permissive(observation["pixels"])["x-python-type"] == "numpy.ndarray"
    assert "type" not in permissive(observation["thing"])  # any value: no type to fail
    assert "cannot describe" in permissive(observation["thing"])["description"]


def test_api_docs_and_tools_answer(paint_url: str) -> None:
    with httpx.Client(base_url=paint_url) as http:
        openapi = http.get("/openapi.json")
        assert openapi.status_code == 200, openapi.text
        assert "/schema" in openapi.json()["paths"]
        docs = http.get("/docs")
        assert docs.status_code == 200
        assert "swagger" in docs.text.lower()
        tools = http.get("/tools")
        assert tools.status_code == 200, tools.text
        [paint] = tools.json()["tools"]
        stroke = paint["input_schema"]
        assert stroke["properties"]["width"]["type"] == "integer"
        assert permissive(stroke["properties"]["mask"])["x-python-type"] == "numpy.ndarray"


@pytest.mark.asyncio(loop_scope="session")
async def test_mcp_lists_a_tool_whose_argument_has_such_a_field(paint_url: str) -> None:
    async with Client(f"{paint_url}/mcp") as mcp:
        [paint] = (await mcp.list_tools()).tools
        assert paint.name == "paint"
        mask = paint.input_schema["properties"]["mask"]
        assert permissive(mask)["x-python-type"] == "numpy.ndarray"
        called = await mcp.call_tool("paint", {"stroke": {"width": 3}})
        assert not called.is_error, called.content


@pytest.mark.asyncio(loop_scope="session")
async def test_the_web_form_renders_and_steps(
    paint_url: str, new_page: Callable[..., Awaitable[Page]]
) -> None:
    page = await new_page(paint_url)
    form = page.locator("#action-form")
    await expect(form.get_by_label("Brush")).to_be_visible()
    await expect(form.get_by_label("Mask")).to_be_visible()
    await expect(form.get_by_label("Handle")).to_be_visible()
    await reset(page)
    rows = await page.locator("#history tbody tr:not(.detail)").count()
    await form.get_by_label("Brush").fill("7")
    await page.get_by_role("button", name="Step").click()
    await idle(page)
    await expect(page.locator("#history tbody tr:not(.detail)")).to_have_count(rows + 1)
    assert (await observation(page))["brush"] == 7


class ToollessPainter(CoreEnvironment[CorePaint, CoreCanvas, oe_types.State]):
    """No tools: only /schema and the page's form meet the fields."""

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> CoreCanvas:
        return CoreCanvas()

    def step(self, action: CorePaint, timeout_s: float | None = None, **kwargs: Any) -> CoreCanvas:
        return CoreCanvas(done=True)

    @property
    def state(self) -> oe_types.State:
        return oe_types.State()


def test_schema_of_an_openenv_app_without_tools() -> None:
    app = core_create_app(ToollessPainter, CorePaint, CoreCanvas, env_name="plain")
    with run_server(app) as url, httpx.Client(base_url=url) as http:
        answer = http.get("/schema")
        assert answer.status_code == 200, answer.text
        mask = answer.json()["action"]["properties"]["mask"]
        assert permissive(mask)["x-python-type"] == "numpy.ndarray"


# Such fields inside lists, dicts and unions: RandomAgent samples what the
# server accepts (leaving them out, or another variant), and names a required one.
class Brushes(Action):
    model_config = ARBITRARY
    size: int = 1
    masks: list[np.ndarray] = []
    layers: dict[str, np.ndarray] = {}
    tint: np.ndarray | int = 0
    stroke: Stroke | None = None


class Needs(Action):
    model_config = ARBITRARY
    mask: np.ndarray


class Brusher(Environment[Brushes, Canvas, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> Canvas:
        return Canvas()

    def step(self, action: Brushes) -> Canvas:
        return Canvas(brush=action.size)

    @property
    def state(self) -> State:
        return State()


class Needy(Brusher):
    def step(self, action: Needs) -> Canvas:  # type: ignore[override]
        return Canvas()


def test_random_agent_samples_actions_the_server_accepts() -> None:
    app = openenv_create_app(Brusher, Brushes, Canvas, max_concurrent_envs=4)
    with run_server(app) as url:
        tasks = [
            Task(id=f"t{i}", env=url, agent=RandomAgent(seed=i), seed=i, max_steps=20)
            for i in range(8)
        ]
        results = Runners.sync_run_task(tasks, RunConfig(progress=False))
    assert all(r.ok and r.steps == 20 for r in results), [r.error for r in results]


def test_random_agent_names_a_required_field_it_cannot_sample() -> None:
    app = openenv_create_app(Needy, Needs, Canvas, max_concurrent_envs=1)
    with run_server(app) as url:
        [result] = Runners.sync_run_task(
            [Task(id="t0", env=url, agent=RandomAgent(seed=0))], RunConfig(progress=False)
        )
    assert not result.ok
    assert result.error is not None
    assert "RandomAgent cannot sample mask: a numpy.ndarray" in result.error.message
