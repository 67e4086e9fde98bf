"""Protocol v2 against v1, and RemoteVectorEnv against an in-process SyncVectorEnv.

Servers run pinned to core 0, load to core 1 (as in ``run.py``), alternating
v1 and v2 on the same server process for several rounds, so the machine's
changing speed meets both alike:

* **echo**: 512 sessions of ``envs/echo_env`` (``openenv serve``). v1: one
  session per connection, driven by ``openenv bench`` (picows). v2: 8
  connections of 64 sessions, each sending a frame of 64 steps and waiting for
  their 64 replies. Reported: steps per second and per server CPU-second.
  ``--baseline REV`` also runs v2 against ``openenv serve`` at that git
  revision in every round (its ``src/`` exported, as ``run.py`` does).
* **CartPole-v1** through the Gymnasium adapter, 64 environments:
  ``RemoteVectorEnv`` (server on core 0) against ``SyncVectorEnv`` in process
  (on core 1), the same random actions; the vector session also with
  ``busy_poll=0`` (a client that sleeps while it waits). One process on core
  1 holds all four and steps them in turns, ``calls / 8`` steps each, eight
  turns a round (in alternating order); ratios are taken turn by turn.
* **scale**: 16,384 sessions held open, over 16 v2 connections and over 16,384
  v1 connections: server memory per session, and the p99 of a step's latency
  (v2: a batch's round trip) while every session steps.

    python benchmarks/multiplex.py --baseline REV  # what `make bench-multiplex` runs
    python benchmarks/multiplex.py --rounds 1 --duration 2 --skip-scale
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from run import (  # noqa: E402
    BENCH_DIR,
    OPENENV_WS,
    PY,
    ROOT,
    Running,
    Sampler,
    Server,
    export_src,
    measured,
    uvicorn,
)

ECHO_STEP = {"message": "hello"}


# -- the v2 load generator (runs as its own process on core 1) ----------------------


async def v2_load(
    url: str, connections: int, per_connection: int, duration: float
) -> dict[str, Any]:
    """Closed loop: each connection sends one frame stepping all its sessions, waits
    for every reply, and again. Latency is a frame's round trip."""
    from websockets.asyncio.client import connect

    from openenv.protocol_v2 import SUBPROTOCOL

    ws_url = url.replace("http://", "ws://") + "/ws"
    sockets = [
        await connect(ws_url, subprotocols=[SUBPROTOCOL], compression=None, max_size=2**26)  # type: ignore[list-item]
        for _ in range(connections)
    ]

    async def exchange(ws: Any, frame: str, count: int) -> None:
        await ws.send(frame)
        got = 0
        while got < count:
            replies = orjson.loads(await ws.recv())
            for reply in replies:
                if reply["type"] == "error":
                    raise RuntimeError(reply)
            got += len(replies)

    opens = orjson.dumps([{"session": i, "type": "open"} for i in range(per_connection)]).decode()
    resets = orjson.dumps([{"session": i, "type": "reset"} for i in range(per_connection)]).decode()
    steps = orjson.dumps(
        [{"session": i, "type": "step", "data": ECHO_STEP} for i in range(per_connection)]
    ).decode()
    setup = time.perf_counter()
    await asyncio.gather(*(exchange(ws, opens, per_connection) for ws in sockets))
    await asyncio.gather(*(exchange(ws, resets, per_connection) for ws in sockets))
    setup_s = time.perf_counter() - setup
    latencies: list[float] = []
    counting = False
    stop = time.perf_counter() + 1.0 + duration  # one second of warm-up first

    async def drive(ws: Any) -> int:
        done = 0
        while (now := time.perf_counter()) < stop:
            await exchange(ws, steps, per_connection)
            if counting:
                done += per_connection
                latencies.append(time.perf_counter() - now)
        return done

    async def warm() -> None:
        nonlocal counting
        await asyncio.sleep(1.0)
        counting = True

    started = time.perf_counter()
    warmer = asyncio.create_task(warm())
    counts = await asyncio.gather(*(drive(ws) for ws in sockets))
    await warmer
    elapsed = time.perf_counter() - started - 1.0
    for ws in sockets:
        await ws.close()
    latencies.sort()
    return {
        "steps": sum(counts),
        "elapsed_s": elapsed,
        "steps_per_s": sum(counts) / elapsed,
        "setup_s": setup_s,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
    }


def measured_v2(
    running: Running, connections: int, per_connection: int, duration: float
) -> dict[str, Any]:
    sampler = Sampler(running)
    started = time.perf_counter()
    argv = [
        "taskset", "-c", "1", str(PY), __file__, "--v2-load", running.url,
        "--connections", str(connections), "--per-connection", str(per_connection),
        "--duration", str(duration),
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    sampler.close()
    if out.returncode != 0:
        raise RuntimeError(f"v2 load failed: {out.stderr}")
    report: dict[str, Any] = json.loads(out.stdout)
    window_from = started + report["setup_s"] + 1.0 + 0.4  # after interpreter start, setup, warmup
    report.update(sampler.window(window_from, window_from + duration - 0.6))
    return report


# -- scenarios ------------------------------------------------------------------------


def echo(rounds: int, duration: float, baseline: str = "") -> dict[str, list[dict[str, Any]]]:
    argv = [str(PY.parent / "openenv"), "serve", str(ROOT / "envs" / "echo_env"),
            "--max-sessions", "20000"]  # fmt: skip
    running = Running(Server("ours-serve", "openenv serve envs/echo_env", argv))
    base = None
    if baseline:
        src = export_src(baseline)
        env = {"PYTHONPATH": f"{src}:{BENCH_DIR}"}
        base = Running(Server("base-serve", f"openenv serve at {baseline}", argv, env=env))
    out: dict[str, list[dict[str, Any]]] = {"v1": [], "v2": [], "v2-base": []}
    try:
        for n in range(rounds):
            v1 = measured(running, 512, duration, json.dumps(ECHO_STEP))
            # Which of the two v2 servers goes first alternates from round to round.
            v2s = [("v2", running), ("v2-base", base)][:: 1 if n % 2 == 0 else -1]
            reports = {name: measured_v2(r, 8, 64, duration) for name, r in v2s if r is not None}
            for name, report in (("v1", v1), *reports.items()):
                report["per_cpu"] = report["steps_per_s"] / max(report["server_cpu"], 1e-9)
                out[name].append(report)
                print(
                    f"echo {name}: {report['steps_per_s']:,.0f} steps/s, server CPU "
                    f"{report['server_cpu']:.2f}, {report['per_cpu']:,.0f} steps/CPU-s",
                    flush=True,
                )
    finally:
        running.stop()
        if base is not None:
            base.stop()
    return out


def cartpole(
    rounds: int, calls: int, baseline: str = "", num_envs: int = 64
) -> dict[str, list[float]]:
    servers = {
        "remote": Server(
            "cartpole",
            "envs/gymnasium_env (CartPole-v1), a session per environment",
            uvicorn(PY, "server.app:app", ROOT / "envs" / "gymnasium_env", "--ws", OPENENV_WS),
        ),
        "remote-vector": Server(
            "cartpole-vector",
            "envs/gymnasium_env (CartPole-v1) with GYMNASIUM_VECTOR=1, a vector session",
            uvicorn(PY, "server.app:app", ROOT / "envs" / "gymnasium_env", "--ws", OPENENV_WS),
            env={"GYMNASIUM_VECTOR": "1"},
        ),
    }
    if baseline:
        vector = servers["remote-vector"]
        servers["remote-vector-base"] = dataclasses.replace(
            vector,
            name="cartpole-vector-base",
            what=f"the same at {baseline}",
            env={**vector.env, "PYTHONPATH": f"{export_src(baseline)}:{BENCH_DIR}"},
        )
    running = {kind: Running(server) for kind, server in servers.items()}
    out: dict[str, list[float]] = {}
    try:
        for _ in range(rounds):
            argv = [
                "taskset", "-c", "1", str(PY), __file__, "--vector",
                running["remote"].url, running["remote-vector"].url,
                "--calls", str(calls), "--num-envs", str(num_envs),
            ]  # fmt: skip
            if baseline:
                argv += ["--vector-base", running["remote-vector-base"].url]
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
            for kind, rates in json.loads(done.stdout).items():
                out.setdefault(kind, []).extend(rates)
                print(f"cartpole {kind}: {statistics.median(rates):,.0f} env-steps/s", flush=True)
    finally:
        for each in running.values():
            each.stop()
    return out


SLICES = 8  # turns a round: each kind steps calls / SLICES times, then the next


def vector_rates(
    sessions_url: str, vector_url: str, calls: int, num_envs: int, base_url: str | None = None
) -> dict[str, list[float]]:
    """Each kind's env-steps per second, slice by slice: the kinds take turns in
    slices of a fraction of a second, so a change in the machine's speed meets
    every kind alike (timed in separate processes one after another, one kind
    could get a slow second the others did not)."""
    import gymnasium
    from gymnasium.vector import SyncVectorEnv

    from openenv.adapters.gymnasium import RemoteVectorEnv

    envs: dict[str, Any] = {
        "sync": SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * num_envs),
        "remote": RemoteVectorEnv(sessions_url, num_envs=num_envs),
        "remote-vector": RemoteVectorEnv(vector_url, num_envs=num_envs),
        "remote-vector-sleeping": RemoteVectorEnv(vector_url, num_envs=num_envs, busy_poll=0),
    }
    if base_url is not None:  # the client is this tree's; the server is the baseline's
        envs["remote-vector-base"] = RemoteVectorEnv(base_url, num_envs=num_envs)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, (max(1, calls // SLICES), num_envs))
    out: dict[str, list[float]] = {kind: [] for kind in envs}
    for envs_of_kind in envs.values():
        envs_of_kind.reset(seed=0)
        for a in actions[:50]:  # warm-up
            envs_of_kind.step(a)
    for turn in range(SLICES):
        # The order alternates, so no kind always follows the same one.
        for kind, stepped in list(envs.items())[:: 1 if turn % 2 == 0 else -1]:
            started = time.perf_counter()
            for a in actions:
                stepped.step(a)
            out[kind].append(len(actions) * num_envs / (time.perf_counter() - started))
    for each in envs.values():
        each.close()
    return out


def scale(sessions: int, connections: int, duration: float) -> dict[str, Any]:
    server = Server(
        "ours-serve",
        "openenv serve envs/echo_env",
        [str(PY.parent / "openenv"), "serve", str(ROOT / "envs" / "echo_env"),
         "--max-sessions", str(sessions + 100)],
    )  # fmt: skip
    out: dict[str, Any] = {}
    for kind in ("v2", "v1"):
        running = Running(server, max_sessions=sessions + 100)
        try:
            idle_rss = running.sample()[2]
            if kind == "v2":
                report = measured_v2(running, connections, sessions // connections, duration)
            else:
                report = measured(running, sessions, duration, json.dumps(ECHO_STEP))
                report["p99_ms"] = report["latency_ms"]["p99"]
            report["rss_per_session"] = (report["rss"] - idle_rss) / sessions
            out[kind] = report
            print(
                f"scale {kind}: {sessions:,} sessions, {report['rss_per_session'] / 1024:.1f} "
                f"KiB/session, p99 {report['p99_ms']:.1f} ms, {report['steps_per_s']:,.0f} steps/s",
                flush=True,
            )
        finally:
            running.stop()
    return out


def encodings(frames: int = 20_000) -> dict[str, dict[str, float]]:
    """A reply frame of 64 steps, JSON (orjson) against msgpack: bytes, encode, decode."""
    import timeit

    import msgpack  # installed with the ray extra

    echo_reply = {"echoed_message": "hello", "message_length": 5}
    pole = {"observation": [0.01, -0.2, 0.03, 0.4], "terminated": False, "truncated": False,
            "info": {}, "frame": None}  # fmt: skip
    out = {}
    for name, observation in (("echo", echo_reply), ("cartpole", pole)):
        frame = [
            {"session": i, "type": "observation", "id": i,
             "data": {"observation": observation, "reward": 1.0, "done": False}}
            for i in range(64)
        ]  # fmt: skip
        as_json, as_msgpack = orjson.dumps(frame), msgpack.packb(frame)

        def per_frame(fn: Any) -> float:
            return timeit.timeit(fn, number=frames) / frames * 1e6

        out[name] = {
            "json_bytes": len(as_json),
            "msgpack_bytes": len(as_msgpack),
            "json_encode_us": per_frame(lambda f=frame: orjson.dumps(f)),
            "msgpack_encode_us": per_frame(lambda f=frame: msgpack.packb(f)),
            "json_decode_us": per_frame(lambda b=as_json: orjson.loads(b)),
            "msgpack_decode_us": per_frame(lambda b=as_msgpack: msgpack.unpackb(b)),
        }
        row = out[name]
        print(
            f"{name} frame of 64: JSON {row['json_bytes']:,} B, encode {row['json_encode_us']:.1f} "
            f"us, decode {row['json_decode_us']:.1f} us; msgpack {row['msgpack_bytes']:,} B, "
            f"encode {row['msgpack_encode_us']:.1f} us, decode {row['msgpack_decode_us']:.1f} us",
            flush=True,
        )
    return out


def _per_round(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[float]:
    """``a``'s steps per server CPU-second over ``b``'s, round by round."""
    return [x["per_cpu"] / y["per_cpu"] for x, y in zip(a, b, strict=True)]


def _ratios(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--cartpole-only", action="store_true", help="only the CartPole rows")
    parser.add_argument("--echo-only", action="store_true", help="only the echo rows")
    parser.add_argument("--v2-load", metavar="URL")
    parser.add_argument("--vector", nargs=2, metavar=("SESSIONS_URL", "VECTOR_URL"))
    parser.add_argument("--vector-base", metavar="URL", help="a vector server at --baseline")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--per-connection", type=int, default=64)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--baseline", default="", help="also run v2 at this git revision")
    args = parser.parse_args()
    if args.v2_load:
        report = asyncio.run(
            v2_load(args.v2_load, args.connections, args.per_connection, args.duration)
        )
        print(json.dumps(report))
        return
    if args.vector:
        rates = vector_rates(*args.vector, args.calls, args.num_envs, args.vector_base)
        print(json.dumps(rates))
        return
    if not args.echo_only:
        encodings()
    echo_runs = echo(args.rounds, args.duration, args.baseline) if not args.cartpole_only else {}
    pole = cartpole(args.rounds, args.calls, args.baseline) if not args.echo_only else {}
    med = statistics.median
    if echo_runs:
        v1 = med(r["per_cpu"] for r in echo_runs["v1"])
        v2 = med(r["per_cpu"] for r in echo_runs["v2"])
        v2_v1 = _per_round(echo_runs["v2"], echo_runs["v1"])
        print(
            f"\necho, 512 sessions: v1 {med(r['steps_per_s'] for r in echo_runs['v1']):,.0f} "
            f"steps/s ({v1:,.0f}/CPU-s), v2 8x64 "
            f"{med(r['steps_per_s'] for r in echo_runs['v2']):,.0f} steps/s ({v2:,.0f}/CPU-s): "
            f"v2/v1 per server CPU-second {med(v2_v1):.2f}x (rounds {_ratios(v2_v1)})"
        )
        if echo_runs["v2-base"]:
            ours_base = _per_round(echo_runs["v2"], echo_runs["v2-base"])
            base_v1 = _per_round(echo_runs["v2-base"], echo_runs["v1"])
            print(
                f"v2 per server CPU-second against {args.baseline}: {med(ours_base):.2f}x "
                f"(rounds {_ratios(ours_base)}); v2/v1 at {args.baseline} {med(base_v1):.2f}x "
                f"(rounds {_ratios(base_v1)})"
            )
    if not pole:
        return
    # The kinds took turns slice by slice: their ratios within a slice are what
    # compare alike on a machine whose speed changes from second to second.
    per_slice = {
        kind: [r / s for r, s in zip(pole[kind], pole["sync"], strict=True)]
        for kind in pole
        if kind != "sync"
    }
    print(f"CartPole-v1 x64, medians: SyncVectorEnv {med(pole['sync']):,.0f} env-steps/s")
    for kind, what in (
        ("remote", "RemoteVectorEnv over 64 sessions"),
        ("remote-vector", "RemoteVectorEnv over one vector session"),
        ("remote-vector-sleeping", "the same with busy_poll=0"),
        ("remote-vector-base", f"the same, server at {args.baseline}"),
    ):
        if kind not in per_slice:
            continue
        ratios = per_slice[kind]
        rounds = [med(ratios[i : i + SLICES]) for i in range(0, len(ratios), SLICES)]
        print(
            f"  {what}: {med(pole[kind]):,.0f} env-steps/s, {med(ratios):.2f}x over "
            f"{len(ratios)} slices (slices {min(ratios):.2f}-{max(ratios):.2f}; "
            f"rounds {_ratios(rounds)})"
        )
    if "remote-vector-base" in pole:
        pairs = zip(pole["remote-vector"], pole["remote-vector-base"], strict=True)
        ours = [a / b for a, b in pairs]
        print(
            f"  vector session, this tree over {args.baseline}: {med(ours):.2f}x the steps/s "
            f"(slices {min(ours):.2f}-{max(ours):.2f})"
        )
    if not args.skip_scale:
        scale(16384, 16, args.duration)


if __name__ == "__main__":
    main()
