"""The loop thread's CPU per step on protocol v2's batched path, without sockets.

What ``multiplex.py``'s echo rows measure through a real server, the loop
thread's share alone, steady enough to compare two revisions of the code on
this machine: 8 connections (``MuxConnection``) of 64 echo sessions each are
fed a frame of 64 steps apiece, the calls the frames hand to the threads run
on the spot, their outcomes are delivered, and the reply frames built, in one
thread pinned to core 0 (no sockets, no worker threads, no client). By
default the environment's ``step`` is left out (every call returns one
observation), so what is timed is openenv's own work: decoding, validating
the actions, planning and answering the calls, encoding the replies.

Each measurement is a fresh process over a tree's ``src/`` (this one, or
``--baseline REV`` exported as ``run.py`` does), the two alternating, and
reports the 10th percentile of its rounds' time per step; the output gives
the median over processes and the per-pair ratios.

    python benchmarks/v2_path.py --baseline REV   # what `make bench-v2-path` runs
    python benchmarks/v2_path.py --with-env       # the echo environment's step included
    python benchmarks/v2_path.py --instructions --rounds 20 --baseline REV  # callgrind's count

A baseline must have v2's batches (``Handoff.dispatch_batch``, 372fd79 and later).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent


def measure(rounds: int, with_env: bool) -> float:
    """µs per step (10th percentile of ``rounds``), in this process's ``openenv``."""
    import orjson
    import uvloop

    from echo_env.models import EchoObservation
    from echo_env.server.app import app
    from openenv.server.gc_tuning import tune_gc
    from openenv.server.handoff_calls import outcome
    from openenv.server.mux import Lane, MuxConnection

    tune_gc(20_000)  # as `openenv serve` does
    observation = EchoObservation(echoed_message="hello", message_length=5, reward=0.5)
    handed: list[tuple[Any, Any]] = []

    class Inline:
        """The handoff, minus the threads: what a frame hands over is kept, run below."""

        def dispatch_batch(self, calls: Any, receiver: Any) -> None:
            handed.append((calls, receiver))

    async def run() -> list[float]:
        service = app.state.openenv
        connections = []
        for _ in range(8):
            connection = MuxConnection(None, service, None, None, None)  # type: ignore[arg-type]
            for key in range(64):
                lane = connection.lanes[key] = Lane(connection, key)
                lane.session = await service.make_session()
            connections.append(connection)
        service.__dict__["handoff"] = Inline()
        frame = orjson.dumps(
            [{"session": k, "type": "step", "data": {"message": "hello"}} for k in range(64)]
        ).decode()

        def one_round() -> None:
            for connection in connections:
                connection._take(frame)
            for calls, receiver in handed:
                if with_env:
                    outcomes = [(i, *outcome(t, fn, args)) for i, (t, fn, args) in enumerate(calls)]
                else:
                    outcomes = [(i, True, observation) for i in range(len(calls))]
                receiver.batch_outcomes(outcomes)
            handed.clear()
            for connection in connections:
                connection.outbox._pending_frame()  # the frame the writer would send

        for _ in range(30):
            one_round()
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            one_round()
            times.append((time.perf_counter() - started) / (8 * 64) * 1e6)
        return sorted(times)

    times = uvloop.run(run())
    return times[len(times) // 10]


def in_tree(src: Path, rounds: int, with_env: bool) -> float:
    """``measure`` in a fresh process whose ``openenv`` is ``src``'s, on core 0."""
    code = (
        "import sys, json; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
        "import v2_path; print(json.dumps(v2_path.measure(int(sys.argv[3]), sys.argv[4] == '1')))"
    )
    argv = ["taskset", "-c", "0", sys.executable, "-c", code, str(src), str(ROOT / "envs"),
            str(rounds), "1" if with_env else "0"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(BENCH_DIR)}
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    return float(json.loads(done.stdout))


def instructions(src: Path, rounds: int, with_env: bool) -> float:
    """Instructions per step in ``src``'s tree, counted by callgrind: the count of
    ``rounds`` more rounds than a run of ``rounds``, over their steps (start-up and
    warm-up cancel out). Steady to a few tenths of a percent on a busy machine."""
    return callgrind_per_step("v2_path", src, rounds, with_env, 8 * 64)


def callgrind_per_step(module: str, src: Path, rounds: int, flag: bool, steps: int) -> float:
    """``module.measure(rounds, flag)``'s instructions per step (``steps`` a round) in
    ``src``'s tree, all threads, by callgrind: a run of ``2 * rounds`` less one of ``rounds``."""
    counts = []
    for n in (rounds, 2 * rounds):
        out = BENCH_DIR / f".callgrind-{module}-{os.getpid()}-{n}.out"
        code = (
            "import sys, importlib; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
            "importlib.import_module(sys.argv[5]).measure(int(sys.argv[3]), sys.argv[4] == '1')"
        )
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                "-c", code, str(src), str(ROOT / "envs"), str(n), "1" if flag else "0",
                module]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(BENCH_DIR), "PYTHONHASHSEED": "0"}
        subprocess.run(argv, capture_output=True, check=True, env=env)
        try:
            totals = [line for line in out.read_text().splitlines() if line.startswith("totals:")]
            counts.append(int(totals[0].split()[1]))
        finally:
            out.unlink()
    return (counts[1] - counts[0]) / (rounds * steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="", help="also measure src/ at this git revision")
    parser.add_argument("--runs", type=int, default=7, help="processes per tree")
    parser.add_argument("--rounds", type=int, default=300, help="rounds of 8 frames per process")
    parser.add_argument("--with-env", action="store_true", help="run the echo env's step too")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per step with callgrind instead (--rounds 20 is plenty)",
    )
    args = parser.parse_args()
    trees = {"this tree": ROOT / "src"}
    if args.baseline:
        sys.path.insert(0, str(BENCH_DIR))
        from run import export_src

        trees[args.baseline] = export_src(args.baseline)
    if args.instructions:
        for name, src in trees.items():
            count = instructions(src, args.rounds, args.with_env)
            print(f"{name}: {count:,.0f} instructions per step")
        return
    results: dict[str, list[float]] = {name: [] for name in trees}
    for n in range(args.runs):
        for name, src in list(trees.items())[:: 1 if n % 2 == 0 else -1]:
            results[name].append(in_tree(src, args.rounds, args.with_env))
        print("  ".join(f"{name}: {values[-1]:.2f} us" for name, values in results.items()))
    what = "with the echo env's step" if args.with_env else "openenv's own work"
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name}: {median:.2f} us per step ({what}), median of {args.runs}")
    if args.baseline:
        ratios = [a / b for a, b in zip(results["this tree"], results[args.baseline], strict=True)]
        print(
            f"this tree / {args.baseline}: {statistics.median(ratios):.3f} "
            f"(pairs {', '.join(f'{r:.3f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
