"""The API docs pages (``/docs``, ``/redoc``), which work behind an API key too.

FastAPI's pages fetch ``/openapi.json`` without the key, so on a server with
one they showed only an error. A browser carries the key in the page's URL
(``/docs?api_key=KEY``, as for the web page), and the page passes it on to
the schema it fetches.
"""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import HTMLResponse

__all__ = ["add_docs_pages"]


def add_docs_pages(app: FastAPI) -> None:
    """Add ``/docs`` and ``/redoc`` to ``app``, built with ``docs_url=None`` and
    ``redoc_url=None`` (FastAPI's own pages)."""

    def schema_url(request: Request) -> str:
        url = request.scope.get("root_path", "") + (app.openapi_url or "/openapi.json")
        key = request.query_params.get("api_key")
        return f"{url}?{urlencode({'api_key': key})}" if key else url

    async def docs(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=schema_url(request), title=f"{app.title} - Swagger UI"
        )

    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(openapi_url=schema_url(request), title=f"{app.title} - ReDoc")

    app.add_route("/docs", docs, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)
