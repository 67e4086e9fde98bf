"""``/docs`` behind an API key: the schema declares the key, and Swagger UI's
"Try it out" sends it, in Chromium.

Swagger UI's files come from a CDN; the browser here gets them from the
``swagger-ui-py`` package instead (a dev dependency, which ships Swagger UI
5), so the page runs offline with the same code.
"""

from __future__ import annotations

import mimetypes
from importlib import resources
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Route, expect

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import EnvSpec, create_app, create_multi_app
from openenv.testing import run_server

KEY = "docs-key/with+odd=chars"  # as a base64 key: no subprotocol could carry it
CDN = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/"


def echo(**settings: Any) -> Any:
    return create_app(EchoEnvironment, EchoAction, EchoObservation, **settings)


async def _from_the_package(route: Route) -> None:
    name = route.request.url.removeprefix(CDN)
    path = resources.files("swagger_ui").joinpath("static", name)
    content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    await route.fulfill(body=path.read_bytes(), content_type=content_type)


@pytest.mark.asyncio(loop_scope="session")
async def test_try_it_out_on_docs_opened_with_the_key_is_answered(
    browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The page and its schema loaded, but every request Swagger UI then sent
    # went without the key: "Try it out" showed 401.
    monkeypatch.delenv("OPENENV_API_KEY", raising=False)
    with run_server(echo(api_key=KEY)) as url:
        context = await browser.new_context()
        try:
            context.set_default_timeout(15_000)
            await context.route(f"{CDN}**", _from_the_package)
            await context.route("https://fastapi.tiangolo.com/**", lambda route: route.abort())
            page = await context.new_page()
            await page.goto(f"{url}/docs?{httpx.QueryParams(api_key=KEY)}")
            metadata = page.locator('.opblock-get:has([data-path="/metadata"])')
            await metadata.locator(".opblock-summary").click()
            await metadata.get_by_role("button", name="Try it out").click()
            async with page.expect_response(f"{url}/metadata") as answered:
                await metadata.get_by_role("button", name="Execute").click()
            assert (await answered.value).status == 200
            status = metadata.locator(
                ".live-responses-table td.response-col_status:not(.col_header)"
            )
            await expect(status).to_have_text("200")
            await expect(metadata.locator(".live-responses-table")).to_contain_text(
                "EchoEnvironment"
            )
        finally:
            await context.close()


def test_the_schema_declares_the_key_only_on_a_server_that_has_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENENV_API_KEY", raising=False)
    key = {"X-API-Key": KEY}
    with run_server(echo(api_key=KEY)) as url:
        schema = httpx.get(f"{url}/openapi.json", headers=key).json()
        schemes = schema["components"]["securitySchemes"]
        assert schemes["APIKeyHeader"] == {"type": "apiKey", "in": "header", "name": "X-API-Key"}
        assert schemes["APIKeyQuery"] == {"type": "apiKey", "in": "query", "name": "api_key"}
        assert schemes["HTTPBearer"] == {"type": "http", "scheme": "bearer"}
        needed = [{"APIKeyHeader": []}, {"HTTPBearer": []}, {"APIKeyQuery": []}]
        assert schema["paths"]["/metadata"]["get"]["security"] == needed
        assert schema["paths"]["/reset"]["post"]["security"] == needed
        assert "security" not in schema["paths"]["/health"]["get"]  # public: no key needed
        # Each way the schema names does open a route.
        for ways in ({"headers": key}, {"headers": {"Authorization": f"Bearer {KEY}"}}):
            assert httpx.get(f"{url}/metadata", **ways).status_code == 200  # type: ignore[arg-type]
        assert httpx.get(f"{url}/metadata", params={"api_key": KEY}).status_code == 200
    with run_server(echo()) as url:
        schema = httpx.get(f"{url}/openapi.json").json()
        assert "securitySchemes" not in schema.get("components", {})
        assert not [
            path
            for path, operations in schema["paths"].items()
            if any("security" in operation for operation in operations.values())
        ]
    keyed = EnvSpec(EchoEnvironment, EchoAction, EchoObservation, api_key=KEY)
    with run_server(create_multi_app({"a": keyed})) as url:
        schema = httpx.get(f"{url}/openapi.json", headers=key).json()
        assert "APIKeyHeader" in schema["components"]["securitySchemes"]
        assert schema["paths"]["/envs"]["get"]["security"] == needed
        assert "security" not in schema["paths"]["/health"]["get"]
