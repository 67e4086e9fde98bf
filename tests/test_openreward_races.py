"""OpenReward's ``/create`` and ``/delete`` on one session id, overlapping: a second
create of an id being created takes no slot and makes nothing, and a delete that
comes while the session is being made ends it once it is made."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

import httpx
import pytest
from servers import Tracker, health, slots_free, until

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, create_app
from openenv.testing import run_server

TASK = {"split": "train", "index": 0}


class Held(CounterEnvironment):
    """Its making (``__init__``) or its reset, as ``hold_in`` says, waits for ``gate``;
    ``tracker`` counts instances made and closed."""

    hold_in: ClassVar[str] = ""
    gate: ClassVar[threading.Event] = threading.Event()
    entered: ClassVar[threading.Semaphore] = threading.Semaphore(0)
    tracker: ClassVar[Tracker] = Tracker()

    def __init__(self) -> None:
        super().__init__()
        Held.tracker.on_create(self)
        if Held.hold_in == "__init__":
            self._hold()

    def reset(self, *args: Any, **kwargs: Any) -> CounterObservation:
        if Held.hold_in == "reset":
            self._hold()
        return super().reset(*args, **kwargs)

    def close(self) -> None:
        Held.tracker.on_close(self)

    def _hold(self) -> None:
        Held.entered.release()
        assert Held.gate.wait(60)


def _app(hold_in: str, cap: int = 4, queue_timeout: float = 0) -> Any:
    Held.hold_in, Held.tracker = hold_in, Tracker()
    Held.gate.clear()
    Held.entered = threading.Semaphore(0)
    # session_timeout: a session left open would hold its slot far past any test.
    concurrency = ConcurrencyConfig(
        max_concurrent_envs=cap, queue_timeout=queue_timeout, session_timeout=300
    )
    return create_app(Held, CounterAction, CounterObservation, concurrency)


async def _new_sid(http: httpx.AsyncClient) -> dict[str, str]:
    opened = (await http.post("/create_session")).text
    return {"X-Session-ID": opened.split("data: ", 1)[1].split()[0]}


async def _held() -> None:
    """Wait until a session's making (or reset) is held at the gate."""
    assert await asyncio.to_thread(Held.entered.acquire, True, 30)


@pytest.mark.parametrize("hold_in", ["__init__", "reset"])
async def test_creates_racing_on_one_id_take_one_slot_and_make_one_environment(
    hold_in: str,
) -> None:
    """The id is claimed before the slot: while its first /create runs, every other
    /create of it is the documented 400 at once, holding no slot, making nothing."""
    with run_server(_app(hold_in)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            sid = await _new_sid(http)
            try:
                first = asyncio.create_task(http.post("/create", json=TASK, headers=sid))
                await _held()
                racing = [
                    asyncio.create_task(http.post("/create", json=TASK, headers=sid))
                    for _ in range(4)
                ]

                # Old servers make each racer an environment before refusing it:
                # stop waiting at whichever comes first.
                async def settled() -> bool:
                    return all(r.done() for r in racing) or len(Held.tracker.created) > 1

                await until(settled, what="the racing creates answered")
                assert len(Held.tracker.created) == 1
                for refused in racing:
                    answer = refused.result()
                    assert (answer.status_code, answer.json()) == (
                        400,
                        {"detail": "Session already exists"},
                    )
                assert (await health(url))["active_sessions"] == 1
                assert not first.done()
            finally:
                Held.gate.set()
            assert (await first).json() == {"sid": sid["X-Session-ID"]}
            ping = await http.post("/ping", headers=sid)
            assert ping.json() == {"status": "ok"}
            assert (await http.post("/delete", headers=sid)).json() == {"sid": sid["X-Session-ID"]}
        await slots_free(url)
        await Held.tracker.until_closed(1)
        assert len(Held.tracker.created) == len(Held.tracker.closed) == 1


@pytest.mark.parametrize("hold_in", ["__init__", "reset"])
async def test_a_delete_while_the_session_is_made_ends_it_once_made(hold_in: str) -> None:
    """A /delete that comes while its /create still runs (a slow factory or reset) is
    kept: the session is closed as soon as it is made, its slot freed, and the id
    answers 410 after, as for a session deleted once made."""
    with run_server(_app(hold_in)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            sid = await _new_sid(http)
            try:
                creating = asyncio.create_task(http.post("/create", json=TASK, headers=sid))
                await _held()
                deleted = await http.post("/delete", headers=sid)
                assert (deleted.status_code, deleted.json()) == (200, {"sid": sid["X-Session-ID"]})
            finally:
                Held.gate.set()
            created = await creating
            assert (created.status_code, created.json()) == (200, {"sid": sid["X-Session-ID"]})
            await slots_free(url)
            await Held.tracker.until_closed(1)
            after = await http.post("/ping", headers=sid)
            assert after.status_code == 410
            assert "has ended (client close)" in after.json()["detail"]
            # A second delete is the no-op it is for any ended session.
            assert (await http.post("/delete", headers=sid)).status_code == 200
        assert len(Held.tracker.created) == len(Held.tracker.closed) == 1


async def test_a_delete_while_the_create_waits_in_line_takes_it_out_of_the_line() -> None:
    """A /create waiting for a slot at a full server, whose id is deleted, leaves the
    line at once (as a client that leaves does) and no environment is made for it."""
    with run_server(_app("", cap=1, queue_timeout=60)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            holder = await _new_sid(http)
            assert (await http.post("/create", json=TASK, headers=holder)).status_code == 200
            sid = await _new_sid(http)
            waiting = asyncio.create_task(http.post("/create", json=TASK, headers=sid))

            async def queued() -> bool:
                return (await health(url))["queued_sessions"] == 1

            await until(queued, what="the create waits in line")
            deleted = await http.post("/delete", headers=sid)
            assert deleted.json() == {"sid": sid["X-Session-ID"]}

            async def left_the_line() -> bool:
                now = await health(url)
                return (now["queued_sessions"], now["active_sessions"]) == (0, 1)

            # While the holder still holds the one slot.
            await until(left_the_line, what="the deleted create out of the line")
            created = await waiting
            assert (created.status_code, created.json()) == (200, {"sid": sid["X-Session-ID"]})
            assert (await http.post("/ping", headers=sid)).status_code == 410
            assert len(Held.tracker.created) == 1  # the holder's only
            await http.post("/delete", headers=holder)
        await slots_free(url)
        assert len(Held.tracker.closed) == 1
