"""``ServerPool``: sessions placed on whichever real server has room, refusals never seen."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from servers import Ping, PingEnvironment, Pong, health
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from tool_envs import SPLITS, Puzzle, ToolBox

from openenv import (
    CapacityError,
    ConcurrencyConfig,
    ConnectionFailedError,
    EnvClient,
    RemoteEnv,
    RunConfig,
    Runners,
    ServerPool,
    State,
    Task,
    create_app,
)
from openenv.client import ws_url
from openenv.client.pool import as_pool
from openenv.runtime import EpisodeSession
from openenv.testing import run_server


class PingClient(EnvClient[Ping, Pong, State]):
    pass


def app(cap: int, queue_timeout: float = 0.0, api_key: str | None = None) -> object:
    concurrency = ConcurrencyConfig(max_concurrent_envs=cap, queue_timeout=queue_timeout)
    keyed = {} if api_key is None else {"api_key": api_key}  # else $OPENENV_API_KEY, if set
    return create_app(PingEnvironment, Ping, Pong, concurrency, **keyed)


@contextlib.contextmanager
def servers(*caps: int, api_key: str | None = None) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(run_server(app(cap, api_key=api_key))) for cap in caps]


def active(url: str) -> int:
    count: int = httpx.get(f"{url}/health").json()["active_sessions"]
    return count


async def hold(pool: ServerPool, n: int) -> list[PingClient]:
    """Open ``n`` sessions at once and step each; raises if any is refused."""
    clients = [PingClient(pool) for _ in range(n)]
    results = await asyncio.gather(*(c.reset() for c in clients), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        await asyncio.gather(*(c.close() for c in clients))
        raise failures[0]
    steps = await asyncio.gather(*(c.step(Ping(message="hi")) for c in clients))
    assert all(step.observation.message == "hi" for step in steps)
    return clients


def test_sessions_fill_every_server_to_its_cap_with_no_refusal() -> None:
    with servers(8, 16, 32) as urls:

        async def scenario() -> None:
            pool = ServerPool(urls)
            clients = await hold(pool, 56)  # exactly the room of all three
            try:
                assert [active(url) for url in urls] == [8, 16, 32]
                assert sorted(view.placed for view in pool.servers()) == [8, 16, 32]
            finally:
                await asyncio.gather(*(c.close() for c in clients))
            assert [view.placed for view in pool.servers()] == [0, 0, 0]

        asyncio.run(scenario())


def test_a_stopped_server_is_passed_over() -> None:
    with run_server(app(4)) as first, run_server(app(4)) as second:
        with run_server(app(4)) as gone:
            pass  # stopped: nothing listens there now

        async def scenario() -> None:
            pool = ServerPool([gone, first, second])
            clients = await hold(pool, 8)
            try:
                assert (active(first), active(second)) == (4, 4)
                down = [view.url for view in pool.servers() if not view.up]
                assert down == [gone]
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        asyncio.run(scenario())


def test_a_server_that_dies_between_checks_is_skipped_by_the_next_session() -> None:
    with run_server(app(8)) as keeps:

        async def scenario() -> None:
            with run_server(app(8)) as dies:
                pool = ServerPool([dies, keeps], refresh=3600)  # no fresh look: it must learn
                pool.ended(await pool.place())  # the first health check sees both up
            clients = await hold(pool, 8)  # `dies` is gone; its estimate still says room
            try:
                assert active(keeps) == 8
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        asyncio.run(scenario())


def test_a_full_pool_waits_for_room_then_places_the_session() -> None:
    with servers(2, 2) as urls:

        async def scenario() -> None:
            pool = ServerPool(urls, wait=30)
            clients = await hold(pool, 4)
            late = asyncio.ensure_future(hold(pool, 1))  # no room: it waits, it is not refused
            await clients.pop().close()  # a slot frees up: the waiting session takes it
            clients += await late
            await asyncio.gather(*(c.close() for c in clients))

        asyncio.run(scenario())


def test_a_pool_full_for_longer_than_its_wait_raises_capacity_error() -> None:
    with run_server(app(1)) as gone:
        pass
    with servers(1, 2) as urls:

        async def scenario() -> None:
            pool = ServerPool([*urls, gone], wait=0.2)
            clients = await hold(pool, 3)
            try:
                with pytest.raises(CapacityError, match="full or down") as refused:
                    await hold(pool, 1)
                # The totals of the servers that are up, as a fleet's refusal gives them.
                assert (refused.value.active_sessions, refused.value.max_sessions) == (3, 3)
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        asyncio.run(scenario())


def test_a_pool_whose_servers_are_all_down_fails_at_once() -> None:
    with run_server(app(1)) as gone:
        pass

    async def scenario() -> None:
        with pytest.raises(ConnectionFailedError, match="no server answered"):
            await PingClient(ServerPool([gone])).reset()

    asyncio.run(scenario())


def test_a_pool_whose_servers_went_down_fails_with_a_connection_error_not_capacity() -> None:
    async def scenario() -> None:
        with run_server(app(1)) as gone:
            pool = ServerPool([gone], wait=0.2)
            pool.ended(await pool.place())  # seen up once
        # Down since: waited for as a restart would be, but not one was full.
        with pytest.raises(ConnectionFailedError, match=r"no server answered on /health for 0\.2s"):
            await PingClient(pool).reset()

    asyncio.run(scenario())


def test_a_full_server_found_on_connect_sends_the_session_elsewhere() -> None:
    # The pool believes both have room (it checked before they filled up).
    with servers(2, 2) as urls:

        async def scenario() -> None:
            pool = ServerPool(urls, refresh=3600)
            pool.ended(await pool.place())  # looks once, while both are empty
            others = await hold(ServerPool(urls[:1]), 2)  # fills the first behind its back
            mine = await hold(pool, 2)
            try:
                assert [active(url) for url in urls] == [2, 2]
                assert pool.servers()[0].free == 0  # refused there: it learnt
            finally:
                await asyncio.gather(*(c.close() for c in others + mine))

        asyncio.run(scenario())


def test_a_pools_tasks_and_tools_are_read_from_the_first_server_that_answers() -> None:
    toolbox = create_app(ToolBox, Ping, Pong)
    with run_server(toolbox) as up:
        with run_server(toolbox) as gone:
            pass  # stopped: nothing listens there now

        async def read(env: RemoteEnv) -> tuple[Any, ...]:
            tools = [tool.name for tool in await env.list_tools()]
            return await env.list_splits(), await env.list_tasks("train", offset=20), tools

        async def scenario() -> None:
            from_pool = await read(RemoteEnv(ServerPool([gone, up]), task_cls=Puzzle))
            assert from_pool == await read(RemoteEnv(up, task_cls=Puzzle))
            assert from_pool[1] == SPLITS["train"][20:]

        asyncio.run(scenario())


def test_urls_joined_by_commas_are_a_pool_for_remote_env_sessions() -> None:
    with servers(2, 2) as urls:

        async def scenario() -> None:
            env = RemoteEnv(",".join(urls))
            sessions = [env.session(seed=i) for i in range(4)]
            for session in sessions:
                await session.open()
            try:
                assert [active(url) for url in urls] == [2, 2]
            finally:
                for session in sessions:
                    await session.close()

        asyncio.run(scenario())


@pytest.mark.parametrize("multiplex", [True, False], ids=["v2", "v1"])
@pytest.mark.parametrize("given_as", ["a ServerPool", "URLs joined by commas"])
def test_runners_spread_tasks_over_a_pool_and_never_see_a_refusal(
    given_as: str, multiplex: bool
) -> None:
    async def agent(session: object) -> None:
        for _ in range(3):
            await session.step(Ping(message="go"))  # type: ignore[attr-defined]

    with servers(3, 5) as urls:
        pool = ServerPool(urls) if given_as == "a ServerPool" else ",".join(urls)
        tasks = [Task(id=f"t{i}", env=pool, agent=agent, seed=i) for i in range(100)]
        config = RunConfig(
            engine_name="local", worker_num=1, max_concurrency=32, multiplex=multiplex
        )
        results = Runners.sync_run_task(tasks, config)
    assert [r.status.value for r in results] == ["ok"] * 100
    assert sum(r.steps for r in results) == 300


class BlocksWhenAsked(PingEnvironment):
    """A step asked to ``block`` blocks its server's event loop (the bug in an
    ``async def`` step that makes ``/health`` say "degraded" for a while)."""

    async def step(self, action: Ping, **kwargs: Any) -> Pong:  # type: ignore[override]
        if action.message == "block":
            time.sleep(1.5)  # noqa: ASYNC251 - the point of it: past the 1 s a block is seen at
        return PingEnvironment.step(self, action)


def test_a_degraded_server_still_takes_sessions_when_no_healthy_one_has_room() -> None:
    concurrency = ConcurrencyConfig(max_concurrent_envs=4)
    slowed_app = create_app(BlocksWhenAsked, Ping, Pong, concurrency)
    with run_server(slowed_app) as slowed, run_server(app(2)) as good:

        async def scenario() -> None:
            async with PingClient(slowed) as blocker:
                await blocker.step(Ping(message="block"))
            assert (await health(slowed))["status"] == "degraded"
            pool = ServerPool([slowed, good], wait=2)
            clients = await hold(pool, 4)  # the healthy server's 2 slots first, then the rest
            try:
                assert (active(slowed), active(good)) == (2, 2)
                assert [(v.up, v.degraded) for v in pool.servers()] == [(True, True), (True, False)]
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        asyncio.run(scenario())


# -- servers that answer their health check wrongly -----------------------------------

NOT_OPENENV_HEALTH = {
    "a JSON list": ("/health", b"[1, 2]"),
    "not JSON": ("/health", b"<html>it works</html>"),
    "a null count": ("/health", b'{"status": "healthy", "max_sessions": null}'),
    "a count that is a word": ("/health", b'{"status": "healthy", "max_sessions": "many"}'),
    "a negative count": ("/health", b'{"max_sessions": 9, "active_sessions": -9}'),
    "a replica listing that is a list": ("/replicas", b"[1]"),
    "a replica whose URL is a number": ("/replicas", b'{"replicas": [{"url": 5}]}'),
}


def answering(path: str, body: bytes) -> Starlette:
    """A server that answers ``path`` with ``body`` (and 404 elsewhere)."""

    async def answer(request: Request) -> Response:
        return Response(body, media_type="application/json")

    return Starlette(routes=[Route(path, answer)])


def two_sessions_land_on(good: str, pool: ServerPool) -> list[tuple[bool, int]]:
    """Open two sessions through ``pool`` and check both are on ``good``; each
    server's ``(up, placed)`` as the pool saw it while they were open."""

    async def scenario() -> list[tuple[bool, int]]:
        async with asyncio.timeout(60):  # a pool that waits on a bad server: for ever
            clients = await hold(pool, 2)
        try:
            assert active(good) == 2
            return [(view.up, view.placed) for view in pool.servers()]
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    return asyncio.run(scenario())


@pytest.mark.parametrize("answer", NOT_OPENENV_HEALTH.values(), ids=NOT_OPENENV_HEALTH.keys())
def test_a_server_whose_health_makes_no_sense_is_passed_over(answer: tuple[str, bytes]) -> None:
    with run_server(answering(*answer)) as odd, run_server(app(2)) as good:
        assert two_sessions_land_on(good, ServerPool([odd, good])) == [(False, 0), (True, 2)]


def test_a_server_that_drops_every_session_it_accepts_is_passed_over() -> None:
    # It advertises the most room, accepts each session, then drops it unanswered.
    async def health(request: Request) -> Response:
        body = b'{"status": "healthy", "max_sessions": 1000}'
        return Response(body, media_type="application/json")

    async def drop(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.receive()
        await websocket.close(1011)

    dropper = Starlette(routes=[Route("/health", health), WebSocketRoute("/ws", drop)])
    with run_server(dropper) as liar, run_server(app(2)) as good:
        assert two_sessions_land_on(good, ServerPool([liar, good])) == [(False, 0), (True, 2)]


def test_a_server_whose_ws_never_opens_fails_the_session_instead_of_holding_it_for_ever() -> None:
    # Its /health says it has room, its /ws is refused: a proxy in front of it
    # that does not pass WebSockets on. Each health check puts it back in the pool.
    async def health(request: Request) -> Response:
        body = b'{"status": "healthy", "max_sessions": 8}'
        return Response(body, media_type="application/json")

    with run_server(Starlette(routes=[Route("/health", health)])) as no_ws:

        async def scenario() -> None:
            pool = ServerPool([no_ws], refresh=0.05)
            async with asyncio.timeout(30):  # it was tried again for ever
                with pytest.raises(ConnectionFailedError, match="no openenv session endpoint"):
                    await PingClient(pool).reset()
            assert [view.placed for view in pool.servers()] == [0]

        asyncio.run(scenario())


def test_a_server_that_trickles_its_health_holds_up_no_placement() -> None:
    # A byte every 50 ms never trips a timeout between reads; only a bound on
    # the whole check keeps the pool from waiting on it for ever.
    stop = threading.Event()

    async def trickle(request: Request) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            yield b'{"status": "healthy", "max_sessions": 9'
            while not stop.is_set():
                yield b" "
                await asyncio.sleep(0.05)

        return StreamingResponse(body(), media_type="application/json")

    slow = Starlette(routes=[Route("/health", trickle)])
    with run_server(slow) as dawdler, run_server(app(2)) as good:
        try:
            pool = ServerPool([dawdler, good], health_timeout=0.5)
            assert two_sessions_land_on(good, pool) == [(False, 0), (True, 2)]
        finally:
            stop.set()


def test_the_pool_sends_the_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a proxy that guards ``/health`` too, a pool made without ``api_key``
    checks its servers with ``$OPENENV_API_KEY``, as every client sends it."""

    async def guarded(request: Request) -> Response:
        if request.headers.get("authorization") != "Bearer k":
            return Response(b'{"detail": "missing API key"}', 401, media_type="application/json")
        return Response(b'{"status": "healthy", "max_sessions": 2}', media_type="application/json")

    proxy = Starlette(routes=[Route("/health", guarded)])
    with run_server(proxy) as url:
        with pytest.raises(ConnectionFailedError, match="no server answered"):  # looks down
            asyncio.run(ServerPool([url], wait=0).place())
        monkeypatch.setenv("OPENENV_API_KEY", "k")
        assert asyncio.run(ServerPool([url], wait=0).place()) == ws_url(url)


async def resets(session: EpisodeSession) -> str:
    await session.reset()
    return "in"


def test_the_sessions_a_pool_places_carry_its_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENENV_API_KEY", raising=False)
    with servers(2, 2, api_key="k") as urls:
        pool = ServerPool(urls, api_key="k")

        async def play() -> str:
            async with PingClient(pool) as env:  # no key of its own: the pool's
                return (await env.step(Ping(message="hi"))).observation.message

        assert asyncio.run(play()) == "hi"
        tasks = [Task(id=f"t{i}", env=pool, agent=resets) for i in range(4)]
        results = Runners.sync_run_task(tasks, RunConfig(worker_num=1))
        assert [(r.status.value, r.value) for r in results] == [("ok", "in")] * 4, results


def test_a_remote_env_on_a_keyed_pool_reads_with_the_pools_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENENV_API_KEY", raising=False)
    with run_server(create_app(ToolBox, Ping, Pong, api_key="k")) as url:

        async def read() -> tuple[list[str], list[str]]:
            env = RemoteEnv(ServerPool([url], api_key="k"))
            return await env.list_splits(), [tool.name for tool in await env.list_tools()]

        splits, tools = asyncio.run(read())
        assert splits == list(SPLITS)
        assert tools


def test_a_pool_moved_to_a_process_that_knows_its_servers_keeps_its_own_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As in a Ray worker that ran an earlier run on the same servers, named "url1,url2".
    monkeypatch.delenv("OPENENV_API_KEY", raising=False)
    with servers(2, 2, api_key="k") as urls:
        earlier = as_pool(",".join(urls))
        moved = pickle.loads(pickle.dumps(ServerPool(urls, api_key="k", wait=5)))
        assert (moved.api_key, moved.wait) == ("k", 5)
        assert moved is not earlier
        assert pickle.loads(pickle.dumps(earlier)) is earlier  # one pool per process still

        async def play() -> str:
            async with PingClient(moved) as env:
                return (await env.step(Ping(message="hi"))).observation.message

        assert asyncio.run(play()) == "hi"


def test_one_pool_places_sessions_from_two_event_loops_checking_at_once() -> None:
    """A pool is one per process for its URLs (``shared``, ``"url1,url2"``), and
    sync clients, Runners' wrappers and threads each run their own event loop:
    two loops' first health checks under way together must each end in their
    own loop, and a second placement in a loop must wait for that loop's."""
    # Each /health answers only once two are under way: the loops' rounds overlap.
    both_asking = threading.Barrier(2)

    async def health(request: Request) -> Response:
        await asyncio.to_thread(both_asking.wait, 30)
        return Response(b'{"status": "healthy", "max_sessions": 8}', media_type="application/json")

    with run_server(Starlette(routes=[Route("/health", health)])) as url:
        pool = ServerPool([url], wait=5)
        placed: dict[str, list[str] | BaseException] = {}

        def in_own_loop(name: str, sessions: int) -> None:
            async def place() -> list[str]:
                async with asyncio.timeout(60):  # a waiter whose round never ends: for ever
                    return list(await asyncio.gather(*(pool.place() for _ in range(sessions))))

            try:
                placed[name] = asyncio.run(place())
            except BaseException as exc:  # the test reads it below
                placed[name] = exc

        threads = [
            threading.Thread(target=in_own_loop, args=("two", 2)),
            threading.Thread(target=in_own_loop, args=("one", 1)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert placed == {"two": [ws_url(url)] * 2, "one": [ws_url(url)]}
        assert [view.placed for view in pool.servers()] == [3]
