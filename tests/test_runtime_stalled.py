"""Runners against a server that stops answering mid-episode (a stopped process).

The task's timeout is reported on time: closing its session, which waits
for that server until the close gives up, happens after the result, not
before it. On worker processes that lateness made the driver take the
worker's loop for blocked, kill it, and play its other episodes again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from runtime_agents import Gated, append_line, echo_agent, wait_for_file
from tcp_proxy import TcpProxy

from echo_env.server.app import app as echo_app
from openenv.client import WebSocketEnvClient
from openenv.runtime import EpisodeSession, RunConfig, Runners, Task
from openenv.testing import run_server

# Generous: the stalled episode's setup takes milliseconds; the bound only
# has to outlast it on a loaded machine.
TIMEOUT = 3.0


async def test_a_timeout_on_a_stalled_server_is_reported_before_its_session_is_closed() -> None:
    events: list[str] = []

    class Watched(WebSocketEnvClient):
        async def close(self) -> None:
            try:
                await super().close()
            finally:  # returned, or given up on
                events.append("closed")

    async def stalling(session: EpisodeSession) -> None:
        await session.reset()
        proxy.stop_reading()
        await session.step({"message": "never answered"})

    with run_server(echo_app) as url, TcpProxy(url) as proxy:
        task = Task(id="stalled", env=proxy.url, agent=stalling, client_cls=Watched)
        config = RunConfig(timeout=TIMEOUT, progress=False)
        async for result in Runners.stream([task], config):
            events.append(f"{result.status.value}, attempts={result.attempts}")
            proxy.cut()  # the close may give up now: the order is settled
    # The close waited up to 5 s for the stopped server, inside the expired timeout.
    assert events == ["timeout, attempts=1", "closed"]


async def test_a_timeout_on_a_stalled_server_costs_the_worker_s_other_episodes_nothing(
    tmp_path: Path,
) -> None:
    ready, gate, go = (str(tmp_path / name) for name in ("ready", "gate", "go"))
    config = RunConfig(worker_num=1, reuse_process=False, max_concurrency=2, progress=False)
    with run_server(echo_app) as url, TcpProxy(url) as proxy:
        # A warm worker process, as the run plays on it: its start-up is not at issue here.
        warm = await Runners.run_task([Task(id="warm", env=url, agent=echo_agent)], config)
        assert warm[0].ok, warm[0]
        tasks = [
            Task(id="stalled", env=proxy.url, agent=Gated(gate, ready), timeout=TIMEOUT),
            Task(id="innocent", env=url, agent=Gated(go)),
        ]

        async def stall() -> None:
            assert await wait_for_file(ready)
            proxy.stop_reading()
            append_line(gate, "go")

        staller = asyncio.create_task(stall())
        results: dict[str, Any] = {}
        async for result in Runners.stream(tasks, config):
            results[result.task_id] = result
            if result.task_id == "stalled":
                append_line(go, "go")  # the innocent episode ends only now: on the same worker
            else:
                proxy.cut()  # the stalled session's close may give up now
        await staller
    stalled, innocent = results["stalled"], results["innocent"]
    assert (stalled.status.value, stalled.attempts) == ("timeout", 1), stalled
    # It was played again: the driver killed its worker, taking the late timeout
    # (closing the stalled session first) for a blocked loop.
    assert (innocent.status.value, innocent.attempts) == ("ok", 1), innocent
