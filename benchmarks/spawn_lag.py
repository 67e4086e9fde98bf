"""How much starting N processes at once stalls the event loop: two ways, one run.

- loop: ``asyncio.create_subprocess_exec`` on uvloop (as uvicorn runs), which
  forks the whole process on the loop thread;
- thread: what coding_env does (``server/process.py``): ``subprocess.Popen``
  in a worker thread (CPython spawns with vfork), the exit seen through a
  pidfd the loop polls, the pipes read with ``add_reader``.

The process carries 150 MB of touched memory, as a busy server does; each
child is ``python3 -I -S -c "import time; time.sleep(1)"``. A ticker task
sleeps 10 ms in a loop and records how late it wakes up: the loop's lag.
Usage: python benchmarks/spawn_lag.py [--processes 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import uvloop

from coding_env.server.process import ChildProcess

ARGV = ["/usr/bin/python3", "-I", "-S", "-c", "import time; time.sleep(1)"]
BALLAST = [bytearray(b"x" * (1 << 20)) for _ in range(150)]


async def via_loop() -> None:
    process = await asyncio.create_subprocess_exec(
        *ARGV, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    await process.communicate()


async def via_thread() -> None:
    child = await ChildProcess.start(ARGV)
    while await child.stdout.read():
        pass
    while await child.stderr.read():
        pass
    await child.exited
    await child.aclose()


async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(time.perf_counter() - start - 0.01)


async def measure(kind: str, processes: int) -> None:
    spawn = via_loop if kind == "loop" else via_thread
    stop, lags = asyncio.Event(), []
    ticking = asyncio.create_task(ticker(stop, lags))
    start = time.perf_counter()
    await asyncio.gather(*(spawn() for _ in range(processes)))
    elapsed = time.perf_counter() - start
    stop.set()
    await ticking
    lags.sort()
    print(
        f"{kind:6} {processes} processes: {elapsed:.2f} s; loop lag p50 "
        f"{lags[len(lags) // 2] * 1000:.1f} ms, p99 {lags[int(len(lags) * 0.99)] * 1000:.1f} ms, "
        f"max {lags[-1] * 1000:.1f} ms"
    )


async def main(processes: int, rounds: int) -> None:
    for _ in range(rounds):
        await measure("loop", processes)
        await measure("thread", processes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    uvloop.run(main(args.processes, args.rounds))
