"""OpenEnv's stateless HTTP calls (``POST /reset``, ``POST /step``, ``GET /state``)
under the load and failures a session over ``/ws`` is held to: deadlines, a
full server, a client that leaves while it waits."""

from __future__ import annotations

import threading

import httpx
from servers import Tracker, health, ping_app, slots_free

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
