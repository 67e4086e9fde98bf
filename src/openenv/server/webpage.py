"""The page at ``/web``: play an environment by hand from a browser.

The page is a few static files shipped inside the package (``web/``): HTML,
style sheets and script modules, with no build step and nothing fetched from other
origins. The script reads ``/metadata`` and ``/schema``, builds a form from the
action's JSON Schema and plays over ``/web/ws``, a session route like ``/ws``.

>>> import httpx
>>> from openenv.testing import run_server
>>> from echo_env.server.app import app
>>> with run_server(app) as url:
...     page, missing = httpx.get(f"{url}/web"), httpx.get(f"{url}/web/secrets.txt")
>>> page.status_code, page.headers["content-type"], missing.status_code
(200, 'text/html; charset=utf-8', 404)
"""

from __future__ import annotations

import functools
from importlib import resources

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["ASSETS", "asset", "page", "read_asset"]

# Every file the page is made of, and its media type; nothing else is served.
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "apikey.js": "text/javascript; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "fetching.js": "text/javascript; charset=utf-8",
    "form.js": "text/javascript; charset=utf-8",
    "history.js": "text/javascript; charset=utf-8",
    "metrics.js": "text/javascript; charset=utf-8",
    "session.js": "text/javascript; charset=utf-8",
    "tasks.js": "text/javascript; charset=utf-8",
    "tools.js": "text/javascript; charset=utf-8",
    "views.css": "text/css; charset=utf-8",
    "views.js": "text/javascript; charset=utf-8",
}

# The page may talk to its own origin only, so an environment's observation
# text can never load or run anything from elsewhere.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Served from the package: revalidate so an upgrade shows up without a hard reload.
    "Cache-Control": "no-cache",
}


@functools.cache
def read_asset(name: str) -> bytes:
    """The bytes of one of the page's files (read once, then cached)."""
    return resources.files("openenv.server").joinpath("web", name).read_bytes()


def _response(name: str) -> Response:
    return Response(read_asset(name), media_type=ASSETS[name], headers=_HEADERS)


async def page(request: Request) -> Response:
    """The page itself."""
    return _response("index.html")


async def asset(request: Request) -> Response:
    """One of the page's script or style files."""
    name = request.path_params["name"]
    if name not in ASSETS or name == "index.html":
        raise HTTPException(404, f"no such file in the web page: {name}")
    return _response(name)
