"""Protocol v2 against v1 on one server, in many short turns: the echo ratio and its spread.

``multiplex.py`` measures v1 and v2 in a few windows of several seconds. On
this machine a steady load's steps per server CPU-second move by a third from
one 1.5-s window to the next (v2 alone: 80k to 124k, the user time per step
7.7 to 12.0 µs), so three rounds give a ratio anywhere from 2.8x to 4.6x.
Many short turns give a median, and quartiles that show the spread.

Both loads run against one ``openenv serve envs/echo_env`` (core 0), each in
its own process on core 1:

* v1: ``openenv bench``, picows, 512 sessions, one per connection;
* v2: ``multiplex.py --v2-load``, 8 connections of 64 sessions.

They take turns. One is stopped (``SIGSTOP``) while the other runs, ``--turn``
seconds each, in ABBA order so a steady drift cancels. Each turn is measured
from ``--settle`` seconds after the switch to its end, once the stopped load's
last requests are answered: the server's steps (its ``/metrics`` counter) and
its CPU time (``/proc``). Two neighbouring turns give one v2/v1 ratio of steps
per server CPU-second.

    python benchmarks/mux_turns.py              # what `make bench-mux-turns` runs
    python benchmarks/mux_turns.py --pairs 10 --turn 1.0
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from run import ECHO_ACTION, PY, ROOT, Running, Server, load_argv  # noqa: E402


def steps_served(url: str) -> float:
    """The server's ``openenv_steps_total``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("openenv_steps_total "):
                return float(line.split()[1])
    raise RuntimeError("no openenv_steps_total in /metrics")


def active_sessions(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
        return int(json.loads(answer.read())["active_sessions"])


def turns(pairs: int, turn: float, settle: float) -> dict[str, Any]:
    argv = [str(PY.parent / "openenv"), "serve", str(ROOT / "envs" / "echo_env"),
            "--max-sessions", "20000"]  # fmt: skip
    running = Running(Server("turns-serve", "openenv serve envs/echo_env", argv))
    url = running.url
    # Long enough for every turn; both are stopped (killed) once the turns are done.
    lasting = str(60 + 2 * pairs * turn * 2)
    v1 = subprocess.Popen(
        load_argv(url, 512, ECHO_ACTION, "--duration", lasting),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    v2_argv = ["taskset", "-c", "1", str(PY), str(BENCH_DIR / "multiplex.py"),
               "--v2-load", url, "--duration", lasting]  # fmt: skip
    v2 = subprocess.Popen(v2_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    loads = {"v1": v1, "v2": v2}
    rates: dict[str, list[float]] = {"v1": [], "v2": []}
    try:
        deadline = time.monotonic() + 60
        while active_sessions(url) < 1024:  # both have opened and reset every session
            for name, load in loads.items():
                if load.poll() is not None:
                    raise RuntimeError(f"the {name} load ended: {load.stderr.read().decode()}")
            if time.monotonic() > deadline:
                raise RuntimeError("the loads did not open their 1,024 sessions within 60 s")
            time.sleep(0.1)
        time.sleep(1.0)  # both warm
        order = ["v1", "v2", "v2", "v1"] * ((pairs + 1) // 2)
        for name in order[: 2 * pairs]:
            other = loads["v2" if name == "v1" else "v1"]
            other.send_signal(signal.SIGSTOP)
            loads[name].send_signal(signal.SIGCONT)
            time.sleep(settle)
            steps0, cpu0 = steps_served(url), running.sample()[1]
            time.sleep(turn - settle)
            steps1, cpu1 = steps_served(url), running.sample()[1]
            rates[name].append((steps1 - steps0) / max(cpu1 - cpu0, 1e-9))
    finally:
        for load in loads.values():
            load.send_signal(signal.SIGCONT)
            load.kill()
            load.wait()
        running.stop()
    ratios = [a / b for a, b in zip(rates["v2"], rates["v1"], strict=True)]
    return {"rates": rates, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20, help="v1/v2 pairs of turns")
    parser.add_argument("--turn", type=float, default=1.5, help="seconds per turn")
    parser.add_argument("--settle", type=float, default=0.25, help="seconds not measured")
    args = parser.parse_args()
    out = turns(args.pairs, args.turn, args.settle)
    rates, ratios = out["rates"], out["ratios"]
    med = statistics.median
    for n, (a, b, r) in enumerate(zip(rates["v1"], rates["v2"], ratios, strict=True)):
        print(f"pair {n + 1:2}: v1 {a:9,.0f}  v2 {b:9,.0f} steps per server CPU-s  {r:.2f}x")
    q = statistics.quantiles(ratios, n=4)
    print(
        f"\necho, 512 sessions, turns of {args.turn:g} s: v1 {med(rates['v1']):,.0f}, "
        f"v2 8x64 {med(rates['v2']):,.0f} steps per server CPU-second; v2/v1 "
        f"{med(ratios):.2f}x (median of {len(ratios)} pairs; quartiles {q[0]:.2f}-{q[2]:.2f}, "
        f"range {min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
