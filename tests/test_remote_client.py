"""The agent-platform client: environments, sessions, the connection gate."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import subprocess
import sys
import threading

import pytest
from servers import Ping, PingEnvironment, Pong, Tracker, ping_app, slots_free
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from openenv import (
    CapacityError,
    ConcurrencyConfig,
    ConnectionFailedError,
    RemoteEnv,
    ServerPool,
    SessionClosedError,
    create_app,
)
from openenv.client.remote import ConnectGate
from openenv.testing import run_server


def test_the_client_imports_no_server_and_no_mcp() -> None:
    code = (
        "import sys, openenv, openenv.client.remote, openenv.client.remote_sync, "
        "counter_env.client; "
        "loaded = {'fastapi', 'starlette', 'uvicorn', 'mcp'} & set(sys.modules); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_gate_bounds_openings_on_whichever_loop_runs_it() -> None:
    gate = ConnectGate(2)
    inside: list[int] = []

    async def enter(active: list[int]) -> None:
        async with gate.semaphore():
            active.append(1)
            inside.append(len(active))
            await asyncio.sleep(0)
            active.pop()

    async def main() -> None:
        active: list[int] = []
        await asyncio.gather(*(enter(active) for _ in range(10)))

    asyncio.run(main())
    asyncio.run(main())  # a second loop gets its own semaphore, no "bound to a different loop"
    assert max(inside) == 2
    with pytest.raises(ValueError, match="at least 1"):
        ConnectGate(0)


async def test_capacity_errors_surface_when_retrying_is_off() -> None:
    app = create_app(PingEnvironment, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=1))
    with run_server(app) as url:
        env = RemoteEnv(url, capacity_timeout=0)
        async with env.session() as held:
            with pytest.raises(CapacityError):
                await env.session().open()
            patient = RemoteEnv(url, capacity_timeout=30)
            waiting = asyncio.create_task(patient.session().open())
            await held.step(Ping(message="x"))
            assert not waiting.done()
        session = await waiting  # the slot came back and the waiting session took it
        assert session.first is not None
        await session.close()


async def test_a_session_used_outside_its_block_says_so() -> None:
    session = RemoteEnv("http://127.0.0.1:9").session()
    with pytest.raises(SessionClosedError, match=r"async with env\.session"):
        await session.call_tool("x")


async def test_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConnectionFailedError, match=f"cannot connect to http://127.0.0.1:{port}"):
        await RemoteEnv(f"http://127.0.0.1:{port}").list_splits()


async def test_a_web_app_at_the_url_is_a_connection_error_and_a_pool_reads_past_it() -> None:
    # The wrong port, say: a web app there answers every path with a page.
    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse("<html>my dashboard</html>")

    web = Starlette(routes=[Route("/{path:path}", page)])
    with run_server(web) as other, run_server(create_app(PingEnvironment, Ping, Pong)) as url:
        env = RemoteEnv(other)
        for call in (env.list_splits, env.list_tools, lambda: env.list_tasks("train")):
            with pytest.raises(ConnectionFailedError, match="is this an openenv server") as caught:
                await call()
            assert other.removeprefix("http://") in str(caught.value)
        # The pool's servers serve the same: the one that answers in JSON is read.
        assert await RemoteEnv(ServerPool([other, url])).list_splits() == []


WRONG_SHAPES = {
    "/splits": {"splits": "train"},  # a string, not a list of names
    "/tools": [{"name": "add"}],  # a list, not an object
    "/tasks": {
        "split": "train",
        "offset": 0,
        "limit": 1,
        "total": 1,
        "tasks": 5,
        "next_offset": None,
    },
}


async def test_json_of_the_wrong_shape_is_a_connection_error_naming_the_url_and_field() -> None:
    # Another service's JSON API on that port: JSON at every route, never openenv's.
    async def document(request: Request) -> JSONResponse:
        return JSONResponse(WRONG_SHAPES[request.url.path])

    api = Starlette(routes=[Route(path, document) for path in WRONG_SHAPES])
    with run_server(api) as other:
        env = RemoteEnv(other)
        calls = {
            "/splits": (env.list_splits, "SplitList (splits: "),
            "/tools": (env.list_tools, "ToolList (it: "),
            "/tasks": (lambda: env.list_tasks("train"), "TaskPage (tasks: "),
        }
        for path, (call, said) in calls.items():
            with pytest.raises(ConnectionFailedError, match="is this an openenv server") as caught:
                await call()
            assert f"{other.removeprefix('http://')}{path}" in str(caught.value)
            assert f"answered JSON that is not a {said}" in str(caught.value)


async def test_the_session_keeps_score_over_steps() -> None:
    app = create_app(PingEnvironment, Ping, Pong)
    with run_server(app) as url:
        async with RemoteEnv(url, observation_cls=Pong).session(seed=3) as session:
            assert session.first is not None
            assert session.first.observation.message == "reset:3"  # type: ignore[attr-defined]
            for _ in range(3):
                await session.step(Ping(message="m"))
            assert (session.steps, session.total_reward, session.done) == (3, 3.0, False)
            await session.reset()
            assert (session.steps, session.total_reward) == (0, 0.0)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _threads() -> int:
    """Threads of this process but the in-process server's environment workers:
    that pool grows while a call looks stuck (a loaded machine) and shrinks
    after idle_exit, which is the server's business, not a client's leak."""
    return sum(not t.name.startswith("openenv-env-") for t in threading.enumerate())


def test_a_thousand_sessions_leave_no_thread_socket_or_slot_behind() -> None:
    tracker = Tracker()
    with run_server(ping_app(tracker, max_envs=64)) as url:
        env = RemoteEnv(url, action_cls=Ping, observation_cls=Pong)

        async def play(count: int) -> None:
            async def one(seed: int) -> None:
                async with env.session(seed=seed) as session:
                    await session.step(Ping())

            await asyncio.gather(*(one(seed) for seed in range(count)))

        with env.sync().session(seed=0) as session:  # the first of each kind starts
            session.step(Ping())  # the threads they share (sync loop, server pool)
        asyncio.run(play(1))
        gc.collect()
        threads, fds = _threads(), _open_fds()
        for seed in range(300):
            with env.sync().session(seed=seed) as session:
                session.step(Ping())
        asyncio.run(play(700))  # at most 64 at once: the rest wait for slots
        gc.collect()
        assert len(tracker.closed) == len(tracker.created) == 1002
        assert (_threads(), _open_fds()) == (threads, fds)
        asyncio.run(slots_free(url))
