"""``openenv validate --url URL``: check a running server, HTTP routes and a real episode."""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import operator
import random
import urllib.error
import urllib.request
from typing import Any

from openenv.cli.checklist import Checklist
from openenv.client import WebSocketEnvClient, http_url
from openenv.client._base import auth_headers
from openenv.runtime.random_agent import sample_pattern

__all__ = ["sample_action", "sample_value", "validate_url"]


class _Unreachable(Exception):
    """Nothing answered at the transport level; later checks cannot run either."""


def validate_url(url: str, *, timeout: float = 10.0) -> Checklist:
    """Check the server at ``url``: ``/health``, ``/metadata``, ``/schema``, then one episode.

    The episode runs over ``/ws`` like any agent's: ``reset``, one ``step`` with
    an action built from the action schema (``sample_action``), ``state``,
    ``close``. Every request gives up after ``timeout`` seconds.

    >>> from openenv.testing import run_server
    >>> from echo_env.server.app import app
    >>> with run_server(app) as url:
    ...     report = validate_url(url)
    >>> report.ok, [check.name for check in report.checks]
    (True, ['/health', '/metadata', '/schema', 'ws reset', 'ws step', 'ws state', 'ws close'])
    """
    try:
        base = http_url(url)
    except ValueError as exc:
        report = Checklist(url)
        report.add("url", "fail", str(exc))
        return report
    report = Checklist(base)
    try:
        health = _get_json(base, "/health", timeout)
    except _Unreachable as exc:
        report.add("/health", "fail", str(exc))
        for name in ("/metadata", "/schema", "ws episode"):
            report.add(name, "skip", "the server is unreachable")
        return report
    except ValueError as exc:
        report.add("/health", "fail", str(exc))
    else:
        _check_health(health, report)
    _check_metadata(base, timeout, report)
    schema = _check_schema(base, timeout, report)
    if schema is None:
        report.add("ws episode", "skip", "no action schema to build an action from")
        return report
    asyncio.run(_check_episode(base, sample_action(schema["action"]), timeout, report))
    return report


def _check_health(health: Any, report: Checklist) -> None:
    if isinstance(health, dict) and health.get("status") == "healthy":
        sessions = f"{health.get('active_sessions')}/{health.get('max_sessions')} sessions in use"
        report.add("/health", "pass", f"healthy, {sessions}")
    else:
        report.add("/health", "fail", f"expected status 'healthy', got {health!r}")


def _check_metadata(base: str, timeout: float, report: Checklist) -> None:
    try:
        metadata = _get_json(base, "/metadata", timeout)
    except (_Unreachable, ValueError) as exc:
        report.add("/metadata", "fail", str(exc))
        return
    if isinstance(metadata, dict) and isinstance(metadata.get("name"), str):
        concurrent = "yes" if metadata.get("supports_concurrent_sessions") else "no"
        report.add("/metadata", "pass", f"{metadata['name']}, concurrent sessions: {concurrent}")
    else:
        report.add("/metadata", "fail", f"expected an object with a name, got {metadata!r}")


def _check_schema(base: str, timeout: float, report: Checklist) -> dict[str, Any] | None:
    try:
        schema = _get_json(base, "/schema", timeout)
    except (_Unreachable, ValueError) as exc:
        report.add("/schema", "fail", str(exc))
        return None
    parts = ("action", "observation", "state")
    if not isinstance(schema, dict) or not all(isinstance(schema.get(p), dict) for p in parts):
        report.add("/schema", "fail", f"expected JSON Schemas for {', '.join(parts)}")
        return None
    fields = ", ".join(schema["action"].get("properties", {})) or "no fields"
    report.add("/schema", "pass", f"action: {fields}")
    return schema


async def _check_episode(
    base: str, action: dict[str, Any], seconds: float, report: Checklist
) -> None:
    client = WebSocketEnvClient(base, connect_timeout=seconds, message_timeout=seconds)
    steps = ["ws reset", "ws step", "ws state", "ws close"]
    try:
        result = await client.reset()
        fields = sorted(result.observation.model_dump(exclude={"reward", "done", "metadata"}))
        report.add(steps.pop(0), "pass", f"observation fields: {', '.join(fields) or 'none'}")
        result = await client.step(action)
        report.add(
            steps.pop(0),
            "pass",
            f"action {json.dumps(action)} -> reward {result.reward}, done {result.done}",
        )
        state = await client.state()
        if state.step_count == 1:
            report.add(steps.pop(0), "pass", f"episode {state.episode_id}, step_count 1")
        else:
            report.add(
                steps.pop(0),
                "warn",
                f"step_count is {state.step_count} after one step (expected 1)",
            )
        await client.close()
        report.add(steps.pop(0), "pass", "session closed")
    except Exception as exc:  # whatever went wrong is the finding; report it, don't crash
        report.add(steps.pop(0), "fail", f"{type(exc).__name__}: {exc}")
        for name in steps:
            report.add(name, "skip", "the episode stopped early")
    finally:
        await client.close()


def _get_json(base: str, route: str, timeout: float) -> Any:
    # The key the episode's client sends too ($OPENENV_API_KEY): every route but /health needs it.
    request = urllib.request.Request(base + route, headers=auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            said = _detail(exc.read()) or exc.reason
            raise ValueError(
                f"GET {route}: HTTP 401 {said}; set OPENENV_API_KEY to the server's key"
            ) from None
        raise ValueError(f"GET {route}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise _Unreachable(_why_unreachable(base, exc.reason, timeout)) from None
    except OSError as exc:  # includes TimeoutError while reading the answer
        raise _Unreachable(_why_unreachable(base, exc, timeout)) from None
    except http.client.HTTPException as exc:  # another protocol's port, or an answer cut short
        raise _Unreachable(f"{base} does not answer as an HTTP server: {exc!r:.120}") from None
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        raise ValueError(f"GET {route}: the answer is not JSON: {body[:80]!r}") from None


def _detail(body: bytes) -> str | None:
    """The ``detail`` of an error answer in JSON, as FastAPI and openenv write it."""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        return None
    return detail if isinstance(detail, str) else None


def _why_unreachable(base: str, reason: object, timeout: float) -> str:
    if isinstance(reason, TimeoutError):
        return f"no answer from {base} within {timeout}s"
    if isinstance(reason, ConnectionRefusedError):
        return f"nothing is listening at {base} (connection refused)"
    return f"cannot reach {base}: {reason}"


def sample_action(schema: dict[str, Any]) -> dict[str, Any]:
    """A valid action for a pydantic JSON Schema: every required field, nothing else.

    >>> from pydantic import Field
    >>> from openenv import Action
    >>> class Move(Action):
    ...     direction: str = Field(pattern="^(up|down)$", examples=["up"])
    ...     steps: int = Field(ge=1, le=5)
    ...     speed: float = 1.0
    >>> sample_action(Move.model_json_schema())
    {'direction': 'up', 'steps': 1}
    """
    value = sample_value(schema, schema.get("$defs", {}))
    return value if isinstance(value, dict) else {}


def sample_value(
    schema: dict[str, Any], defs: dict[str, Any], expanding: frozenset[str] = frozenset()
) -> Any:
    """A value that fits one JSON Schema node (a best effort for patterns and formats).

    ``expanding`` holds the ``$ref``s this node is inside of: a model met again
    within itself is sampled as null (an ``Optional`` field), not forever.

    >>> sample_value({"type": "integer", "exclusiveMinimum": 3}, {})
    4
    >>> sample_value({"anyOf": [{"type": "null"}, {"enum": ["a", "b"]}]}, {})
    'a'
    >>> sample_value({"type": "array", "items": {"type": "boolean"}, "minItems": 2}, {})
    [False, False]
    """
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in expanding:  # a model within itself: only a null can end it
            return None
        return sample_value(defs[ref.rsplit("/", 1)[-1]], defs, expanding | {ref})
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    for key in ("examples", "enum"):
        if schema.get(key):
            return schema[key][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if options := schema.get(key):
            chosen = next((o for o in options if o.get("type") != "null"), options[0])
            return sample_value(chosen, defs, expanding)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        return {name: sample_value(properties[name], defs, expanding) for name in required}
    if kind == "array":
        # A tuple (prefixItems) has an item of its own type in each place.
        items = [sample_value(item, defs, expanding) for item in schema.get("prefixItems", [])]
        rest = schema.get("minItems", 0) - len(items)
        if rest > 0:
            items += [sample_value(schema.get("items") or {}, defs, expanding)] * rest
        return items
    if kind in ("integer", "number"):
        return _sample_number(schema, integer=kind == "integer")
    if kind == "string":
        # The first value RandomAgent's sampler finds for a simple pattern
        # (wordle's five letters): "x" matches few patterns.
        matching = (
            sample_pattern(schema["pattern"], random.Random(0)) if "pattern" in schema else None
        )
        if matching is None:
            matching = _FORMATS.get(schema.get("format", ""))
        return matching if matching is not None else "x" * max(schema.get("minLength", 1), 1)
    return {"boolean": False, "null": None}.get(kind)


# A value of each string format pydantic writes into schemas (datetime, UUID, AnyUrl, ...).
_FORMATS = {
    "date-time": "2000-01-01T00:00:00Z",
    "date": "2000-01-01",
    "time": "00:00:00",
    "duration": "PT0S",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "uri": "http://example.com/",
    "email": "user@example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
}


def _sample_number(schema: dict[str, Any], *, integer: bool) -> int | float:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    candidates: list[float] = [0]
    if low is not None:
        candidates += [low, math.floor(low) + 1]
    if high is not None:
        candidates += [high, math.ceil(high) - 1]
    if low is not None and high is not None:
        candidates.append((low + high) / 2)
    if multiple := schema.get("multipleOf"):
        candidates = [math.ceil(c / multiple) * multiple for c in candidates]
    for value in candidates:
        if (not integer or float(value).is_integer()) and _fits(value, schema):
            return int(value) if integer else float(value)
    return int(low or 0) if integer else float(low or 0)  # a best effort; the server will say


def _fits(value: float, schema: dict[str, Any]) -> bool:
    return all(test(value, schema[key]) for key, test in _BOUNDS if key in schema)


_BOUNDS = (
    ("minimum", operator.ge),
    ("exclusiveMinimum", operator.gt),
    ("maximum", operator.le),
    ("exclusiveMaximum", operator.lt),
)
