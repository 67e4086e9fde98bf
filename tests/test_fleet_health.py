"""A fleet's look at its replicas on a real two-node Ray cluster: one replica
that does not answer holds up no other's counts."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from fleet_kit import ECHO, healthy, replicas, until

from openenv import WebSocketEnvClient
from openenv.fleet import Fleet


def listed_with(url: str, replica: str, sessions: int) -> list[dict[str, Any]]:
    """The directory's listing once it shows ``sessions`` open on ``replica``."""
    deadline = time.monotonic() + 60
    while True:
        listed = replicas(url)
        if any(r["url"] == replica and r["active_sessions"] == sessions for r in listed):
            return listed
        assert time.monotonic() < deadline, f"{sessions} session(s) on {replica} within 60s"
        time.sleep(0.05)


def test_a_stopped_replica_holds_up_no_other_replicas_counts(two_nodes: list[str]) -> None:
    # A replica whose process is stopped (SIGSTOP; a node dropping packets is
    # alike) answers its /health with nothing until the check times out (here
    # 120 s, longer than the test: it is never marked down meanwhile).
    # Asked one after another, every replica after it waited that long at each
    # look, so the fleet saw their sessions only once the stopped one was
    # marked down. Asked at once, the others' sessions show up while its check
    # is still unanswered: it is listed as it was last seen, healthy.
    fleet = Fleet(ECHO, replicas=2, num_cpus=0.5, max_sessions=4, interval=0.1, health_timeout=120)
    with fleet as url:
        until(lambda: len(healthy(url)) == 2, "2 healthy replicas")
        stopped, other = replicas(url)  # in the order the fleet asks them: the stopped one first
        os.kill(stopped["pid"], signal.SIGSTOP)
        try:

            async def open_sessions() -> None:
                clients: list[WebSocketEnvClient] = []
                try:
                    # Two, one after the other: the second is opened after the
                    # fleet has surely asked the stopped replica at least once.
                    for sessions in (1, 2):
                        clients.append(WebSocketEnvClient(other["url"]))
                        await clients[-1].reset()
                        listed = await asyncio.to_thread(listed_with, url, other["url"], sessions)
                        assert [r["status"] for r in listed] == ["healthy", "healthy"], listed
                finally:
                    await asyncio.gather(*(c.close() for c in clients))

            asyncio.run(open_sessions())
        finally:
            os.kill(stopped["pid"], signal.SIGCONT)
        # Back: its check answers again, and it is healthy as before.
        until(lambda: len(healthy(url)) == 2, "the stopped replica healthy again")
