"""Slow-environment isolation, measured by alternation.

One closed-loop *fast half* (``sessions`` sessions whose step returns at once,
driven by ``openenv bench``'s client) runs against the server the whole time.
A *slow half* (as many sessions whose step sleeps 100 ms in ``time.sleep``)
connects once, then steps for ``--on`` seconds and pauses for ``--off``
seconds, ``--cycles`` times.

The fast half's throughput is sampled every 0.1 s. Each on window is
compared with the mean of the off windows on either side of it, each window
starting a moment after the switch (the slow lane's queue fills or drains).
Phases a couple of seconds apart cancel the machine's drift, which on a
shared 2-core VM moves throughput by more than the effect measured.

The *arrival* (the first second after the connected slow half first steps)
is reported apart: every new session starts in the fast lane, so the first
steps of 256 sleeping sessions at once hold up the fast half until they
have moved to the slow lane.

Both halves run in this one process, which ``benchmarks/run.py`` pins to the
load generator's core; it prints JSON.

    python benchmarks/isolation.py http://127.0.0.1:8000 --sessions 256 --cycles 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

import orjson
from websockets.asyncio.client import connect

from openenv import protocol
from openenv.bench import BenchProgress, bench
from openenv.bench._run import now
from openenv.client import ws_url

FAST = {"seconds": 0}
SLOW = {"seconds": 0.1}
ARRIVAL = 1.0  # seconds after the slow half's first steps counted as its arrival
SETTLE_ON = 0.25  # after resuming: every slow session has a step in flight
SETTLE_OFF = 0.5  # after pausing: the slow lane's queue has drained


def rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """The fast half's replies per second between the first and last sample in [start, end]."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        raise RuntimeError(f"too few samples in a window of {end - start:.2f} s")
    (t0, r0), (t1, r1) = inside[0], inside[-1]
    return (r1 - r0) / (t1 - t0)


class SlowHalf:
    """Sessions that step while ``stepping`` is set and wait while it is not."""

    def __init__(self, url: str, sessions: int) -> None:
        self.url = ws_url(url)
        self.sessions = sessions
        self.stepping = asyncio.Event()
        self.stop = False
        self.replies = 0
        self.errors = 0
        self.ready = 0
        self.all_ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._session()) for _ in range(self.sessions)]

    async def close(self) -> None:
        self.stop = True
        self.stepping.set()
        await asyncio.gather(*self._tasks)

    async def _session(self) -> None:
        step = protocol.request_frame("step", SLOW)
        arrived = False
        try:
            async with connect(self.url, compression=None) as ws:
                await ws.send(protocol.request_frame("reset", {}))
                await ws.recv()
                arrived = True
                self._arrived()
                while True:
                    await self.stepping.wait()
                    if self.stop:
                        return
                    await ws.send(step)
                    reply = orjson.loads(await ws.recv())
                    if reply.get("type") == "observation":
                        self.replies += 1
                    else:
                        self.errors += 1
        except Exception:
            self.errors += 1
            if not arrived:
                self._arrived()  # counted anyway, so the run does not wait for it

    def _arrived(self) -> None:
        self.ready += 1
        if self.ready == self.sessions:
            self.all_ready.set()


async def measure(url: str, sessions: int, cycles: int, on: float, off: float) -> dict[str, Any]:
    samples: list[tuple[float, int]] = []
    fast_errors = 0

    def fast_progress(p: BenchProgress) -> None:
        nonlocal fast_errors
        fast_errors = p.errors
        if p.phase == "measuring":
            samples.append((now(), p.replies))

    # Longer than the schedule can take; the fast half is stopped once it is over.
    total = 30.0 + ARRIVAL + cycles * (on + off) + off
    fast = asyncio.ensure_future(
        bench(
            url,
            sessions=sessions,
            duration=total,
            warmup=1.0,
            action=FAST,
            progress=fast_progress,
            progress_interval=0.1,
        )
    )
    while not samples:
        if fast.done():
            fast.result()  # raises what stopped it
            raise RuntimeError("the fast half stopped before measuring")
        await asyncio.sleep(0.05)

    offs: list[float] = []
    ons: list[float] = []
    slow = SlowHalf(url, sessions)
    start = now()
    await asyncio.sleep(off)
    offs.append(rate(samples, start, now()))
    slow.start()
    await slow.all_ready.wait()
    await asyncio.sleep(SETTLE_OFF)  # the connects' own work is not the slow half's steps
    arrived = now()
    slow.stepping.set()
    await asyncio.sleep(ARRIVAL)
    arrival = rate(samples, arrived, now())
    slow_time, slow_replies = 0.0, 0
    for cycle in range(cycles):
        if cycle:  # the first on window follows the arrival
            slow.stepping.set()
            await asyncio.sleep(SETTLE_ON)
        start, replies = now(), slow.replies
        await asyncio.sleep(on)
        ons.append(rate(samples, start, now()))
        slow_time += now() - start
        slow_replies += slow.replies - replies
        slow.stepping.clear()
        start = now()
        await asyncio.sleep(off)
        offs.append(rate(samples, start + SETTLE_OFF, now()))
    await slow.close()
    fast.cancel()
    await asyncio.gather(fast, return_exceptions=True)
    changes = [ons[i] / ((offs[i] + offs[i + 1]) / 2) - 1 for i in range(cycles)]
    return {
        "alone": statistics.mean(offs),
        "beside_slow": statistics.mean(ons),
        "changes": changes,
        "arrival_change": arrival / offs[0] - 1,
        "slow": slow_replies / slow_time,
        "errors": fast_errors + slow.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--sessions", type=int, default=256, help="sessions in each half")
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--on", type=float, default=1.5, help="seconds the slow half steps")
    parser.add_argument("--off", type=float, default=1.5, help="seconds the slow half waits")
    args = parser.parse_args()
    import uvloop

    result = uvloop.run(measure(args.url, args.sessions, args.cycles, args.on, args.off))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
