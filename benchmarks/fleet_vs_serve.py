"""Ray actors (openenv's fleet) against Ray Serve on the same load: why the fleet uses actors.

One replica of echo_env each: a `Fleet` (the replica is a full openenv server
in a Ray actor; clients reach its socket directly through a `ServerPool` on
the fleet's directory) and a Ray Serve deployment of the same app
(`serve.ingress`, `max_ongoing_requests=256`; clients go through Serve's
proxy). `openenv bench` drives each, C=64 for 5 s, alternating.

Ray Serve is not one of the project's dependencies: run it in a venv of its
own, from the repository root:

    python3 -m venv /tmp/serve-venv
    /tmp/serve-venv/bin/pip install "ray[serve]==2.60.0" -e . -e envs/echo_env picows
    /tmp/serve-venv/bin/python benchmarks/fleet_vs_serve.py 3
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

OPENENV = str(Path(sys.executable).with_name("openenv"))
ECHO = Path(__file__).resolve().parent.parent / "envs" / "echo_env"
PORT = 8765


def build() -> Any:
    """The ASGI app each Serve replica runs: echo_env's, as uvicorn would serve it."""
    from echo_env.server.app import app

    return app


def bench(target: str, sessions: int = 64, duration: float = 5.0) -> dict[str, Any]:
    argv = [OPENENV, "bench", target, "--sessions", str(sessions), "--json"]
    argv += ["--duration", str(duration), "--action", '{"message": "hi"}']
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    report: dict[str, Any] = json.loads(out.stdout)
    if report["sessions_ok"] != sessions:
        raise RuntimeError(f"sessions failed: {report['errors']} {report.get('error_samples')}")
    return report


def row(name: str, runs: list[dict[str, Any]]) -> str:
    rate = statistics.median(r["steps_per_s"] for r in runs)
    p50 = statistics.median(r["latency_ms"]["p50"] for r in runs)
    p99 = statistics.median(r["latency_ms"]["p99"] for r in runs)
    return f"| {name} | {rate:,.0f} | {p50:.2f} ms | {p99:.2f} ms |"


def main() -> None:
    import ray
    from ray import serve

    from openenv.fleet import Fleet

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    # Serve's default (5 requests in flight per replica) would hold 5 WebSockets.
    deployment = serve.deployment(max_ongoing_requests=256)(serve.ingress(build)())
    serve.run(deployment.bind(), route_prefix="/")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    fleet_runs, serve_runs = [], []
    try:
        with Fleet(ECHO, replicas=1, num_cpus=0, max_sessions=256) as directory:
            for _ in range(rounds):
                fleet_runs.append(bench(f"{directory},"))
                serve_runs.append(bench(f"ws://127.0.0.1:{PORT}/ws"))
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"| path (echo_env, C=64, 5 s, medians of {rounds} rounds) | steps/s | p50 | p99 |")
    print("|---|---|---|---|")
    print(row("openenv fleet, one replica (a Ray actor; ServerPool on its directory)", fleet_runs))
    print(row("Ray Serve, one replica (serve.ingress of the same app, via its proxy)", serve_runs))


if __name__ == "__main__":
    main()
