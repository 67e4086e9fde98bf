"""Slow-environment isolation, measured by alternation.

One closed-loop *fast half* (``sessions`` sessions whose step returns at once)
runs against the server the whole time. A *slow half* (as many sessions whose
step sleeps 100 ms in ``time.sleep``) is switched on and off beside it:
``--off`` seconds without it, then the slow half connects, steps for ``--on``
seconds and closes, ``--cycles`` times, ending with one more off window.

The fast half's throughput is sampled every 0.25 s. Each on window (the slow
half's measured steps, after its connects and a second of warm-up) is compared
with the mean of the off windows on either side of it (from half a second
after the slow half closed). Phases a few seconds apart cancel the machine's
drift, which on a shared 2-core VM moves throughput by more than the effect
measured. The *arrival* (from the slow half's first connect to its measured
steps) is reported apart: every new session starts in the fast lane, so the
first steps of 256 sleeping sessions arriving at once hold up the fast half
until they have moved to the slow lane.

Both halves run in this one process, which `benchmarks/run.py` pins to the
load generator's core; it prints JSON.

    python benchmarks/isolation.py http://127.0.0.1:8000 --sessions 256 --cycles 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

from openenv.bench import BenchProgress, bench
from openenv.bench._run import now

FAST = {"seconds": 0}
SLOW = {"seconds": 0.1}
SETTLE = 0.5  # seconds after the slow half closed before an off window counts


def rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """The fast half's replies per second between the first and last sample in [start, end]."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        raise RuntimeError(f"too few samples in a window of {end - start:.2f} s")
    (t0, r0), (t1, r1) = inside[0], inside[-1]
    return (r1 - r0) / (t1 - t0)


async def measure(url: str, sessions: int, cycles: int, on: float, off: float) -> dict[str, Any]:
    samples: list[tuple[float, int]] = []
    fast_errors = 0

    def fast_progress(p: BenchProgress) -> None:
        nonlocal fast_errors
        fast_errors = p.errors
        if p.phase == "measuring":
            samples.append((now(), p.replies))

    # Longer than the schedule can take; the fast half is stopped once it is over.
    total = 2.0 + cycles * (on + off + 10.0) + off
    fast = asyncio.ensure_future(
        bench(
            url,
            sessions=sessions,
            duration=total,
            warmup=1.0,
            action=FAST,
            progress=fast_progress,
            progress_interval=0.25,
        )
    )
    while not samples:
        if fast.done():
            fast.result()  # raises what stopped it
            raise RuntimeError("the fast half stopped before measuring")
        await asyncio.sleep(0.05)
    offs: list[float] = []
    ons: list[float] = []
    arrivals: list[float] = []
    slow_rates: list[float] = []
    slow_errors = 0

    async def off_window(settle: float) -> None:
        start = now()
        await asyncio.sleep(off)
        offs.append(rate(samples, start + settle, now()))

    await off_window(0.0)
    for _ in range(cycles):
        ticks: list[float] = []

        def slow_progress(p: BenchProgress, ticks: list[float] = ticks) -> None:
            if p.phase == "measuring":
                ticks.append(now())

        arriving = now()
        report = await bench(
            url,
            sessions=sessions,
            duration=on,
            warmup=1.0,
            action=SLOW,
            progress=slow_progress,
            progress_interval=0.25,
        )
        slow_rates.append(report.steps_per_second)
        slow_errors += sum(report.errors.values())
        ons.append(rate(samples, ticks[0], ticks[-1]))
        arrivals.append(rate(samples, arriving, ticks[0]))
        await off_window(SETTLE)
    fast.cancel()
    await asyncio.gather(fast, return_exceptions=True)
    changes = [ons[i] / ((offs[i] + offs[i + 1]) / 2) - 1 for i in range(cycles)]
    arrival_changes = [arrivals[i] / ((offs[i] + offs[i + 1]) / 2) - 1 for i in range(cycles)]
    return {
        "alone": statistics.mean(offs),
        "beside_slow": statistics.mean(ons),
        "changes": changes,
        "arrival_changes": arrival_changes,
        "slow": statistics.median(slow_rates),
        "errors": fast_errors + slow_errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--sessions", type=int, default=256, help="sessions in each half")
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--on", type=float, default=3.0, help="seconds the slow half steps")
    parser.add_argument("--off", type=float, default=3.0, help="seconds without the slow half")
    args = parser.parse_args()
    import uvloop

    result = uvloop.run(measure(args.url, args.sessions, args.cycles, args.on, args.off))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
