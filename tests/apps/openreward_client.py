"""OpenReward's real SDK against an openenv server; run by tests/test_openreward_sdk.py.

It runs in a virtual environment of its own (tests/apps/openreward_requirements.txt)
and never imports openenv. ``python openreward_client.py MODE URL NAME KEY [N]``
prints one JSON report on its last line. The flows are the SDK's documented ones:
``client.environments.get(name, base_url=...)``, ``list_tasks``, ``session(task=...)``
or ``session(split=..., index=...)``, ``get_prompt``, ``list_tools``, ``call_tool``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import aiohttp
import openreward
from openreward import AsyncOpenReward, OpenReward
from openreward.api.errors import SessionTerminatedError, ToolCallError, ToolFailed


def text(blocks: Any) -> str:
    return "".join(b.text for b in blocks if getattr(b, "type", "") == "text")


def sync_flow(url: str, name: str, key: str) -> dict[str, Any]:
    """The documented synchronous flow, counting to a task's target."""
    with OpenReward(api_key=key) as client:
        env = client.environments.get(name=name, base_url=url)
        splits = env.list_splits()
        tasks = env.list_tasks(split="train")
        task = tasks[3]
        report: dict[str, Any] = {
            "splits": splits,
            "num_tasks": len(tasks),
            "num_tasks_call": env.num_tasks("test"),
            "task_7": env.get_task("train", 7).task_spec,
            "range": [t.task_spec["id"] for t in env.get_task_range("train", 2, 5)],
            "env_tools": [t.name for t in env.list_tools()],
            "openai_tools": env.list_tools(format="openai"),
            "task": task.task_spec,
            "task_env": task.environment_name,
        }
        with env.session(task=task) as session:
            report["prompt"] = text(session.get_prompt())
            report["session_tools"] = [t.name for t in session.list_tools()]
            target = task.task_spec["target"]
            step = session.call_tool("increment", {"amount": target})
            report["increment"] = text(step.blocks)
            done = session.call_tool("submit")
            report["reward"], report["finished"] = done.reward, done.finished
            report["submit_text"] = text(done.blocks)
            try:
                session.call_tool("get_value")
            except ToolCallError as exc:
                report["after_finish"] = exc.reason
    return report


async def async_flow(url: str, name: str, key: str) -> dict[str, Any]:
    """The documented async flow, by split and index, with a wrong answer."""
    client = AsyncOpenReward(api_key=key)
    env = client.environments.get(name=name, base_url=url)
    report: dict[str, Any] = {"splits": await env.list_splits()}
    async with env.session(split="test", index=2) as session:
        report["prompt"] = text(await session.get_prompt())
        await session.call_tool("increment", {"amount": 100})
        value = await session.call_tool("get_value", {})
        report["value"] = text(value.blocks)
        done = await session.call_tool("submit", {})
        report["reward"], report["finished"] = done.reward, done.finished
    await client.environments.aclose()
    return report


async def many(url: str, name: str, key: str, sessions: int) -> dict[str, Any]:
    """``sessions`` episodes at once with asyncio.gather, each to the end."""
    client = AsyncOpenReward(api_key=key)
    env = client.environments.get(name=name, base_url=url)
    tasks = await env.list_tasks(split="train")

    async def episode(i: int) -> float | None:
        task = tasks[i % len(tasks)]
        async with env.session(task=task) as session:
            await session.call_tool("increment", {"amount": task.task_spec["target"]})
            done = await session.call_tool("submit", {})
            return done.reward

    results = await asyncio.gather(*(episode(i) for i in range(sessions)), return_exceptions=True)
    await client.environments.aclose()
    errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return {"rewards": [r for r in results if not isinstance(r, BaseException)], "errors": errors}


def _failure(exc: BaseException) -> dict[str, Any]:
    status = getattr(exc, "status", None)
    return {"type": type(exc).__name__, "status": status, "message": str(exc)[:500]}


async def attacks(url: str, name: str, key: str) -> dict[str, Any]:
    """What the SDK reports for each bad request (each a JSON summary)."""
    report: dict[str, Any] = {}
    client = AsyncOpenReward(api_key=key)
    env = client.environments.get(name=name, base_url=url)

    async def attempt(label: str, coro: Any) -> None:
        try:
            await coro
            report[label] = {"ok": True}
        except BaseException as exc:
            report[label] = _failure(exc)

    await attempt("unknown_env", client.environments.get("nope", base_url=url).list_tasks("train"))
    await attempt(
        "unknown_variant",
        client.environments.get(name, variant="nope", base_url=url).list_splits(),
    )
    await attempt("bad_split", env.list_tasks("nosuch"))
    await attempt("bad_index", env.get_task("train", 10**6))
    wrong = AsyncOpenReward(api_key="wrong-key").environments.get(name, base_url=url)
    await attempt("wrong_key", wrong.list_splits())
    missing = AsyncOpenReward(api_key="").environments.get(name, base_url=url)
    await attempt("missing_key", missing.list_splits())

    async with env.session(split="train", index=0) as session:
        try:
            await session.call_tool("nosuch", {})
        except ToolCallError as exc:
            report["unknown_tool"] = {"reason": exc.reason, "detail": exc.detail}
        try:
            await session.call_tool("increment", {"amount": "many"})
        except ToolCallError as exc:
            report["bad_arguments"] = {"reason": exc.reason, "detail": exc.detail[:300]}
        try:
            await session.call_tool("explode", {})
        except ToolFailed as exc:
            report["tool_raised"] = {"type": "ToolFailed", "message": str(exc)}
        try:
            await session.call_tool("get_value", {})
        except SessionTerminatedError as exc:
            report["after_raise"] = {"type": "SessionTerminatedError", "message": str(exc)}

    # A session id the server never issued, and one that has ended.
    headers = {"X-API-Key": key, "X-Session-ID": "f" * 48}
    call = {"name": "get_value", "input": {}}
    async with aiohttp.ClientSession(base_url=url) as http:
        async with http.post("/call", json=call, headers=headers) as r:
            report["bad_sid_call"] = {"status": r.status, "body": await r.json()}
        async with http.post("/create", json={"split": "train", "index": 0}, headers=headers) as r:
            report["bad_sid_create"] = {"status": r.status, "body": await r.json()}
        async with http.get("/prompt", headers={"X-API-Key": key}) as r:
            report["no_sid"] = {"status": r.status, "body": await r.json()}
        sid = session.sid
        ended = {"X-API-Key": key, "X-Session-ID": sid or ""}
        async with http.post("/ping", headers=ended) as r:
            report["ended_ping"] = {"status": r.status, "body": await r.json()}
    await client.environments.aclose()
    report["sdk_version"] = openreward.__version__ if hasattr(openreward, "__version__") else None
    return report


async def disconnect(url: str, name: str, key: str) -> dict[str, Any]:
    """Open a session, start a slow tool call and drop the connection mid-stream."""
    client = AsyncOpenReward(api_key=key)
    env = client.environments.get(name=name, base_url=url)
    session = env.session(split="train", index=0)
    await session.__aenter__()
    sid = session.sid
    headers = {"X-API-Key": key, "X-Session-ID": sid or "", "Accept": "text/event-stream"}
    async with (
        aiohttp.ClientSession(base_url=url) as http,
        http.post("/call", json={"name": "slow", "input": {"seconds": 1.0}}, headers=headers) as r,
    ):
        first = await r.content.readline()  # "event: task_id", then leave
    # The SDK's session object is dropped without __aexit__: no /delete ever comes.
    if session._ping_task is not None:
        session._ping_task.cancel()
    await client.environments.aclose()
    return {"sid": sid, "first_line": first.decode().strip()}


async def failure(url: str, name: str, key: str, tool: str) -> dict[str, Any]:
    """What the SDK raises for one tool call that fails."""
    client = AsyncOpenReward(api_key=key)
    env = client.environments.get(name=name, base_url=url)
    async with env.session(split="train", index=0) as session:
        try:
            await session.call_tool(tool, {})
            report: dict[str, Any] = {"ok": True}
        except Exception as exc:
            report = {"type": type(exc).__name__, "message": str(exc)}
    await client.environments.aclose()
    return report


def main() -> None:
    mode, url, name, key = sys.argv[1:5]
    if mode == "sync":
        report = sync_flow(url, name, key)
    elif mode == "async":
        report = asyncio.run(async_flow(url, name, key))
    elif mode == "many":
        report = asyncio.run(many(url, name, key, int(sys.argv[5])))
    elif mode == "attacks":
        report = asyncio.run(attacks(url, name, key))
    elif mode == "disconnect":
        report = asyncio.run(disconnect(url, name, key))
    elif mode == "failure":
        report = asyncio.run(failure(url, name, key, sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    report["module"] = openreward.__file__
    print(json.dumps(report))


if __name__ == "__main__":
    main()
