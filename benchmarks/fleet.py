"""A fleet's cost per step: the same load through a one-replica Ray fleet and straight at a server.

`make bench-fleet`: a local Ray cluster, a `Fleet` of one echo_env replica,
and one `openenv serve` of echo_env in a child process, each driven by
`openenv bench` (C sessions, D seconds) in turn, A/B/A/B, `--rounds` rounds.
Through the fleet, `openenv bench DIRECTORY,` places each session with a
`ServerPool` on the replica (it lists `/replicas`); the steps then go straight
to the replica's socket, so the two should match: this checks that they do.

Run from the repository root with the project's venv:
`.venv/bin/python benchmarks/fleet.py [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

from workers import OPENENV, server

ECHO = Path(__file__).resolve().parent.parent / "envs" / "echo_env"


def bench(target: str, sessions: int, duration: float) -> dict[str, Any]:
    argv = [str(OPENENV), "bench", target, "--sessions", str(sessions), "--json"]
    argv += ["--duration", str(duration), "--action", '{"message": "hi"}']
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    report: dict[str, Any] = json.loads(out.stdout)
    if report["sessions_ok"] != sessions:
        raise RuntimeError(f"bench sessions failed: {report['errors']}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    import ray

    from openenv.fleet import Fleet

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    direct: list[dict[str, Any]] = []
    fleet: list[dict[str, Any]] = []
    try:
        with (
            server(1, 256, "server.app:app", cwd=ECHO) as (url, _),
            Fleet(ECHO, replicas=1, num_cpus=0, max_sessions=256) as directory,
        ):
            for _ in range(args.rounds):
                direct.append(bench(url, args.sessions, args.duration))
                fleet.append(bench(f"{directory},", args.sessions, args.duration))
    finally:
        ray.shutdown()

    def row(name: str, runs: list[dict[str, Any]]) -> str:
        rate = statistics.median(r["steps_per_s"] for r in runs)
        p50 = statistics.median(r["latency_ms"]["p50"] for r in runs)
        p99 = statistics.median(r["latency_ms"]["p99"] for r in runs)
        return f"| {name} | {rate:,.0f} | {p50:.2f} ms | {p99:.2f} ms |"

    print(
        "\n".join(
            [
                f"**Fleet overhead** (echo_env, C={args.sessions}, {args.duration:.0f} s, medians "
                f"of {args.rounds} alternating rounds; replica and server one process each):",
                "",
                "| path | steps/s | p50 | p99 |",
                "|---|---|---|---|",
                row("straight at `openenv serve`", direct),
                row("through a one-replica Ray fleet (`ServerPool` on its directory)", fleet),
            ]
        )
    )


if __name__ == "__main__":
    main()
