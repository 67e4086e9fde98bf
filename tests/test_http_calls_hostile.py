"""OpenEnv's stateless HTTP calls (``POST /reset``, ``POST /step``, ``GET /state``)
under the load and failures a session over ``/ws`` is held to: deadlines, a
full server, a client that leaves while it waits."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import httpx
import pytest
from servers import Tracker, health, ping_app, slots_free, until

from counter_env import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, WebSocketEnvClient, create_app
from openenv.testing import run_server


async def test_a_blocking_step_past_its_deadline_is_answered_at_the_deadline() -> None:
    """compat.md: an overrunning call is a 500 saying so, and its slot stays taken
    until it returns. The reply must not wait for the thread as well: the
    step's deadline is what an HTTP caller has too."""
    tracker, gate = Tracker(), threading.Event()
    app = ping_app(tracker, max_envs=1, gate=gate, step_timeout=0.2)
    with run_server(app) as url:
        try:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                answer = await http.post("/step", json={"action": {"block": True}})
                assert answer.status_code == 500
                assert "did not return within 0.2s" in answer.json()["detail"]
                # Answered while the step still runs: its environment is not closed
                # beside it, and its slot is held until it returns.
                assert not gate.is_set()
                assert tracker.closed == []
                assert (await health(url))["active_sessions"] == 1
        finally:
            gate.set()
        await tracker.until_closed(1)
        await slots_free(url)


def _opened(url: str) -> float:
    """Sessions the server has opened, as ``/metrics`` counts them."""
    text = httpx.get(f"{url}/metrics").text
    (line,) = [line for line in text.splitlines() if line.startswith("openenv_sessions_opened")]
    return float(line.split()[1])


async def _create_request(http: httpx.AsyncClient, path: str) -> httpx.Request:
    if path == "/reset":
        return http.build_request("POST", "/reset", json={"seed": 1})
    # OpenReward's: a session id first, then /create opens the session (a slot).
    opened = (await http.post("/create_session")).text
    sid = opened.split("data: ", 1)[1].split()[0]
    task = {"split": "train", "index": 0}
    return http.build_request("POST", "/create", json=task, headers={"X-Session-ID": sid})


@pytest.mark.parametrize("path", ["/reset", "/create"])
async def test_a_caller_that_leaves_while_queued_gets_no_environment(path: str) -> None:
    """production.md: a connection waiting in the admission queue whose client leaves
    leaves the line at once, and no environment is made for it. HTTP calls
    (OpenEnv's ``POST /reset``, OpenReward's ``POST /create``) wait in the same
    line and leave it the same way; they kept their place until the slot freed."""
    concurrency = ConcurrencyConfig(max_concurrent_envs=1, queue_timeout=30)
    app = create_app(CounterEnvironment, CounterAction, CounterObservation, concurrency)
    with run_server(app) as url:
        holder = WebSocketEnvClient(
            url, action_cls=CounterAction, observation_cls=CounterObservation
        )
        await holder.reset()  # the one slot
        async with httpx.AsyncClient(base_url=url, timeout=60) as leaving:
            request = await _create_request(leaving, path)
            waiting = asyncio.create_task(leaving.send(request))

            async def queued() -> bool:
                return (await health(url))["queued_sessions"] == 1

            await until(queued, what="the HTTP call waits in line")
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting

        async def left_the_line() -> bool:
            now = await health(url)
            return (now["queued_sessions"], now["active_sessions"]) == (0, 1)

        # At once, while the slot it waited for is still taken: queued_sessions is
        # what pools and fleets subtract from a server's room.
        await until(left_the_line, what="the caller that left out of line")
        await holder.close()  # its slot frees: the caller in line has gone

        async def settled() -> bool:
            now = await health(url)
            return (now["queued_sessions"], now["active_sessions"]) == (0, 0)

        await until(settled, what="the line and the slots empty")
        assert await asyncio.to_thread(_opened, url) == 1  # the holder's only
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            answer = await http.send(await _create_request(http, path))
            assert answer.status_code == 200
        assert await asyncio.to_thread(_opened, url) == 2
