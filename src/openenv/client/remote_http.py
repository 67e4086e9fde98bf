"""The HTTP side of ``RemoteEnv``: GET one of a server's documents (splits, tasks,
tools, its listing) as the model it is, or a precise error naming the URL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from openenv.client._base import auth_headers, http_detail, ssl_context
from openenv.errors import ConnectionFailedError, NotFoundError, RequestFailedError

if TYPE_CHECKING:
    # Imported on first use instead: importing httpx also imports its CLI (rich,
    # click, pygments) when those are installed, which driving sessions never needs.
    import httpx

__all__ = ["Doc", "get_document", "http_client", "http_headers"]

Doc = TypeVar("Doc", bound=BaseModel)  # what a route answers


async def get_document(
    url: str,
    model: type[Doc],
    params: Mapping[str, Any] | None = None,
    http: httpx.AsyncClient | None = None,
    *,
    headers: Mapping[str, str] | None = None,
) -> Doc:
    """GET a JSON document as a ``model``; HTTP errors become ``NotFoundError`` /
    ``RequestFailedError``, and a document that is not one ``ConnectionFailedError``."""
    import httpx

    try:
        if http is None:
            async with http_client(headers) as own:
                response = await own.get(url, params=params)
        else:
            response = await http.get(url, params=params)
    except httpx.HTTPError as exc:
        raise ConnectionFailedError(url, f"{type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        detail = http_detail(response)
        error = NotFoundError if response.status_code == 404 else RequestFailedError
        raise error(str(response.url), response.status_code, detail)
    try:
        data = response.json()
    except ValueError:  # another service on that port: a web app answering every path
        raise ConnectionFailedError(
            str(response.url),
            f"answered something other than JSON ({response.text[:80]!r}); "
            f"is this an openenv server's URL?",
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:  # JSON, but not this route's: another service's API
        wrong = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'it'}: {e['msg']}" for e in exc.errors()[:3]
        )
        raise ConnectionFailedError(
            str(response.url),
            f"answered JSON that is not a {model.__name__} ({wrong}): {response.text[:80]!r}; "
            f"is this an openenv server's URL?",
        ) from None


def http_client(headers: Mapping[str, str] | None = None) -> httpx.AsyncClient:
    import httpx

    return httpx.AsyncClient(verify=ssl_context(), headers=dict(headers or {}))


def http_headers(options: Mapping[str, Any]) -> dict[str, str]:
    """The HTTP headers a session's handshake would carry: ``headers=``, then the API key."""
    return auth_headers(options.get("headers"), options.get("api_key"))
