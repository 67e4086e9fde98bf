"""The API docs pages (``/docs``, ``/redoc``), which work behind an API key too.

FastAPI's pages fetch ``/openapi.json`` without the key, so on a server with
one they showed only an error. A browser carries the key in the page's URL
(``/docs?api_key=KEY``, as for the web page), and the page passes it on to
the schema it fetches.

On a server with a key, the schema declares it (``components.securitySchemes``:
the ``X-API-Key`` header, a Bearer token, the ``api_key`` query parameter;
``security`` on every route but the public ones), so Swagger UI's "Authorize"
button takes it and "Try it out" sends it; a page opened as
``/docs?api_key=KEY`` is authorized with it from the start.
"""

from __future__ import annotations

import html
import json
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, swagger_ui_default_parameters
from starlette.requests import Request
from starlette.responses import HTMLResponse

from openenv.server.security import is_public

__all__ = ["KEY_HEADER_SCHEME", "SECURITY_SCHEMES", "add_docs_pages", "with_key"]

# Swagger UI's own files, where FastAPI's /docs takes them from.
_SWAGGER_JS = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"
_SWAGGER_CSS = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css"
_FAVICON = "https://fastapi.tiangolo.com/img/favicon.png"

# The ways the server takes its key (server/security.py) that a browser's
# fetch can send; the WebSocket subprotocol is no HTTP route's.
KEY_HEADER_SCHEME = "APIKeyHeader"
SECURITY_SCHEMES: dict[str, dict[str, str]] = {
    KEY_HEADER_SCHEME: {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    "HTTPBearer": {"type": "http", "scheme": "bearer"},
    "APIKeyQuery": {"type": "apiKey", "in": "query", "name": "api_key"},
}
_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def add_docs_pages(app: FastAPI, keyed: bool = False) -> None:
    """Add ``/docs`` and ``/redoc`` to ``app``, built with ``docs_url=None`` and
    ``redoc_url=None`` (FastAPI's own pages); ``keyed``: its routes need an API
    key, which its OpenAPI schema then declares."""
    if keyed:
        _declare_key(app)

    def schema_url(request: Request) -> str:
        url = request.scope.get("root_path", "") + (app.openapi_url or "/openapi.json")
        key = request.query_params.get("api_key")
        return f"{url}?{urlencode({'api_key': key})}" if key else url

    async def docs(request: Request) -> HTMLResponse:
        key = request.query_params.get("api_key") if keyed else None
        return _swagger_ui(schema_url(request), f"{app.title} - Swagger UI", key)

    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(openapi_url=schema_url(request), title=f"{app.title} - ReDoc")

    app.add_route("/docs", docs, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)


def _declare_key(app: FastAPI) -> None:
    """Make ``app.openapi()`` declare the key (FastAPI's documented way to
    extend the schema: replace the method, keep the cached result)."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_key(plain())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def with_key(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the key's schemes, required on every route but the public ones.

    >>> schema = {"paths": {"/health": {"get": {}}, "/schema": {"get": {}}}}
    >>> paths = with_key(schema)["paths"]
    >>> "security" in paths["/health"]["get"], paths["/schema"]["get"]["security"][0]
    (False, {'APIKeyHeader': []})
    """
    schema.setdefault("components", {}).setdefault("securitySchemes", {}).update(SECURITY_SCHEMES)
    anyone: list[dict[str, list[str]]] = [
        {name: []} for name in SECURITY_SCHEMES
    ]  # any one of them will do
    for path, operations in schema.get("paths", {}).items():
        if is_public(path):
            continue
        for method, operation in operations.items():
            if method in _METHODS:
                operation["security"] = anyone
    return schema


def _swagger_ui(schema_url: str, title: str, key: str | None) -> HTMLResponse:
    """FastAPI's Swagger UI page, authorized with ``key`` once its schema has loaded
    (Swagger UI's ``preauthorizeApiKey``, from its ``onComplete``)."""
    config = {"url": schema_url, **swagger_ui_default_parameters}
    return HTMLResponse(
        f"""<!DOCTYPE html>
<html>
<head>
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<link type="text/css" rel="stylesheet" href="{_SWAGGER_CSS}">
<link rel="shortcut icon" href="{_FAVICON}">
<title>{html.escape(title)}</title>
</head>
<body>
<div id="swagger-ui"></div>
<script src="{_SWAGGER_JS}"></script>
<script>
const key = {_script_json(key)};
const ui = SwaggerUIBundle({{
  ...{_script_json(config)},
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  onComplete: () => {{
    if (key) ui.preauthorizeApiKey({_script_json(KEY_HEADER_SCHEME)}, key);
  }},
}});
</script>
</body>
</html>"""
    )


def _script_json(value: object) -> str:
    """``value`` as a JavaScript literal that cannot end the ``<script>`` it is in."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
