"""Instructions per echo step through the thread hand-over of protocol v2's batches.

``v2_path.py`` counts the loop thread's work with the calls run on the spot;
this counts the other half: 8 batches of 64 echo steps a round handed to a
real ``Handoff`` (``Handoff.dispatch_batch``), run by its worker thread, and
their outcomes delivered back to the loop, the environment's ``step``
included. ``--inline`` runs the same calls on the loop thread instead, so the
difference is what the hand-over itself costs a step. Counted by callgrind
(all threads), as the difference between a run of ``2 * rounds`` rounds and
one of ``rounds``, so start-up and warm-up cancel out.

    python benchmarks/handoff_path.py --baseline REV   # what `make bench-handoff` runs
    python benchmarks/handoff_path.py --inline         # the calls without the hand-over

A tree's path alone can move its count by up to 1% (a helper measured one
``src`` copied to two folders), so differences that small between this tree
and a baseline (exported to ``benchmarks/.baseline-REV``) are noise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
CONNECTIONS, PER_CONNECTION = 8, 64


def measure(rounds: int, inline: bool) -> None:
    """Run ``rounds`` rounds (after 20 of warm-up) in this process's ``openenv``."""
    import uvloop

    from echo_env.models import EchoAction
    from echo_env.server.environment import EchoEnvironment
    from openenv.server.gc_tuning import tune_gc
    from openenv.server.handoff import Handoff, LaneTicket
    from openenv.server.handoff_calls import outcome

    tune_gc(20_000)  # as `openenv serve` does
    sessions = CONNECTIONS * PER_CONNECTION
    envs = [EchoEnvironment(max_steps=10**9) for _ in range(sessions)]
    tickets = [LaneTicket() for _ in range(sessions)]
    action = EchoAction(message="hello")

    class Receiver:
        """A frame's receiver: done once every outcome of its batch is back."""

        def __init__(self, waiting: int, done: asyncio.Future[None]) -> None:
            self.waiting, self.done = waiting, done

        def batch_outcomes(self, outcomes: list[tuple[int, bool, Any]]) -> None:
            self.waiting -= len(outcomes)
            if self.waiting == 0:
                self.done.set_result(None)

    async def run() -> None:
        handoff = Handoff(max_threads=4)
        loop = asyncio.get_running_loop()

        async def one_round() -> None:
            frames = []
            for c in range(CONNECTIONS):
                batch = range(c * PER_CONNECTION, (c + 1) * PER_CONNECTION)
                calls = [(tickets[i], envs[i].step, (action,)) for i in batch]
                done = loop.create_future()
                frames.append(done)
                receiver = Receiver(len(calls), done)
                if inline:
                    outcomes = [(i, *outcome(t, fn, args)) for i, (t, fn, args) in enumerate(calls)]
                    receiver.batch_outcomes(outcomes)
                else:
                    handoff.dispatch_batch(calls, receiver)
            await asyncio.gather(*frames)

        try:
            for _ in range(20 + rounds):
                await one_round()
        finally:
            handoff.shutdown()

    uvloop.run(run())


def instructions(src: Path, rounds: int, inline: bool) -> float:
    """Instructions per step in ``src``'s tree, counted by callgrind."""
    from v2_path import callgrind_per_step

    return callgrind_per_step("handoff_path", src, rounds, inline, CONNECTIONS * PER_CONNECTION)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="", help="also count src/ at this git revision")
    parser.add_argument("--rounds", type=int, default=40, help="rounds of 8 frames of 64 steps")
    parser.add_argument("--inline", action="store_true", help="run the calls on the loop thread")
    args = parser.parse_args()
    trees = {"this tree": ROOT / "src"}
    if args.baseline:
        sys.path.insert(0, str(BENCH_DIR))
        from run import export_src

        trees[args.baseline] = export_src(args.baseline)
    what = "run on the loop thread" if args.inline else "through the hand-over"
    for name, src in trees.items():
        count = instructions(src, args.rounds, args.inline)
        print(f"{name}: {count:,.0f} instructions per echo step {what}")


if __name__ == "__main__":
    main()
