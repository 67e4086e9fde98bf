"""Closed-loop benchmarks: our server beside OpenEnv and bare WebSocket echo servers.

Every server runs pinned to core 0 (`taskset -c 0`), the load generator
(`openenv bench`, picows client) to core 1. For each repetition the servers
run in a rotated order, each freshly started (which also times its cold start),
and the same load runs against each at every concurrency level. Then our
two echo servers and the bare uvloop+orjson echo run side by side on core 0,
each under its own load, for the server CPU each spends per step (the
machine's changing speed meets all three alike), and the slow-environment
isolation runs by alternation (``isolation.py``). Python
sources are byte-compiled first, as ``pip install`` does: where
``PYTHONDONTWRITEBYTECODE`` is set, an editable checkout would otherwise
compile openenv's modules at every start, which a deployed server never does. Medians go to
`benchmarks/RESULTS.md` between the markers, with the command that made them.

    python benchmarks/run.py                 # what `make bench` runs
    python benchmarks/run.py --reps 1 --duration 2 --only ours-def,bare-starlette-uvloop-orjson
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
PY = Path(sys.executable)
OPENENV_CORE_VENV = BENCH_DIR / ".venv-openenv-core"
OPENENV_CORE = "openenv-core==0.3.0"
ECHO_ACTION = '{"message": "hello"}'
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
LOG_DIR = BENCH_DIR / ".logs"
MARK_BEGIN = "<!-- bench:begin -->"
MARK_END = "<!-- bench:end -->"


@dataclass
class Server:
    name: str
    what: str
    argv: list[str]
    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)


def uvicorn(python: Path, app: str, app_dir: Path, *extra: str) -> list[str]:
    return [str(python), "-m", "uvicorn", app, "--app-dir", str(app_dir), *extra]


# What the Dockerfiles set (UVICORN_WS) and `openenv serve` uses.
OPENENV_WS = "openenv.server.wsprotocol:WebSocketProtocol"

BASELINE: dict[str, Path] = {}  # set by --baseline: git revision -> its exported src/


def servers() -> list[Server]:
    core_py = OPENENV_CORE_VENV / "bin" / "python"
    base = [
        Server(
            f"base-{kind}",
            f"openenv at {rev}, run as ours-{kind}",
            ours.argv,
            env={"PYTHONPATH": f"{src}:{BENCH_DIR}"},
        )
        for rev, src in BASELINE.items()
        # As ``ours-*`` run: the same apps, on openenv's WebSocket protocol.
        for kind, ours in (
            (
                "def",
                Server(
                    "",
                    "",
                    uvicorn(PY, "server.app:app", ROOT / "envs" / "echo_env", "--ws", OPENENV_WS),
                ),
            ),
            (
                "async",
                Server(
                    "", "", uvicorn(PY, "servers.echo_async:app", BENCH_DIR, "--ws", OPENENV_WS)
                ),
            ),
            # Plain `uvicorn server.app:app`: uvicorn's own WebSocket protocol.
            ("plain", Server("", "", uvicorn(PY, "server.app:app", ROOT / "envs" / "echo_env"))),
        )
    ]
    return [
        *base,
        Server(
            "ours-def",
            "openenv, echo_env as shipped (`def step`)",
            uvicorn(PY, "server.app:app", ROOT / "envs" / "echo_env", "--ws", OPENENV_WS),
        ),
        Server(
            "ours-async",
            "openenv, echo with `async def step`",
            uvicorn(PY, "servers.echo_async:app", BENCH_DIR, "--ws", OPENENV_WS),
        ),
        Server(
            "ours-plain",
            "openenv, echo_env under plain `uvicorn server.app:app` (uvicorn's protocols)",
            uvicorn(PY, "server.app:app", ROOT / "envs" / "echo_env"),
        ),
        Server(
            "openenv-core",
            f"OpenEnv ({OPENENV_CORE}), echo with `def step`",
            uvicorn(core_py, "servers.openenv_core_echo:app", BENCH_DIR),
        ),
        Server(
            "bare-starlette-asyncio-json",
            "bare Starlette WS echo, asyncio + json",
            uvicorn(PY, "servers.starlette_echo:app", BENCH_DIR, "--loop", "asyncio"),
        ),
        Server(
            "bare-starlette-uvloop-orjson",
            "bare Starlette WS echo, uvloop + orjson",
            uvicorn(PY, "servers.starlette_echo:app", BENCH_DIR, "--loop", "uvloop"),
            env={"BENCH_JSON": "orjson"},
        ),
        Server(
            "bare-starlette-openenv-ws",
            "bare Starlette WS echo, uvloop + orjson, on openenv's WebSocket protocol",
            uvicorn(
                PY, "servers.starlette_echo:app", BENCH_DIR, "--loop", "uvloop", "--ws", OPENENV_WS
            ),
            env={"BENCH_JSON": "orjson"},
        ),
        Server(
            "bare-websockets",
            "bare `websockets` echo, asyncio + json",
            [str(PY), "-m", "servers.websockets_echo"],
            cwd=BENCH_DIR,
        ),
    ]


# -- processes ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Running:
    """A server process pinned to core 0, and what /proc says about it."""

    def __init__(self, server: Server, max_sessions: int = 20000) -> None:
        self.server = server
        self.port = free_port()
        argv = list(server.argv)
        if "uvicorn" in argv:
            argv += ["--port", str(self.port), "--log-level", "warning", "--backlog", "4096"]
        else:
            argv += ["--port", str(self.port)]
        env = {**os.environ, "OPENENV_MAX_CONCURRENT_ENVS": str(max_sessions)}
        env["PYTHONPATH"] = str(BENCH_DIR)
        env.update(server.env)
        started = time.perf_counter()
        LOG_DIR.mkdir(exist_ok=True)  # every script that starts servers, not only run.py's main
        log = open(LOG_DIR / f"{server.name}.log", "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", *argv], cwd=server.cwd, env=env, stdout=log, stderr=log
        )
        log.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cold_start = self._wait_healthy(started)

    def _wait_healthy(self, started: float, timeout: float = 60.0) -> float:
        while time.perf_counter() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.server.name} exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - started
            except OSError:
                time.sleep(0.005)
        raise RuntimeError(f"{self.server.name} did not answer /health in {timeout}s")

    def sample(self) -> tuple[float, float, int, int]:
        """(time, CPU seconds, RSS bytes, threads) of the server process."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / CLK_TCK
        threads = int(stat[17])
        rss = int(stat[21]) * PAGE
        return time.perf_counter(), cpu, rss, threads

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Sampler:
    """Samples a server's CPU, RSS and threads every 50 ms in a thread."""

    def __init__(self, running: Running) -> None:
        self.running = running
        self.samples: list[tuple[float, float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.running.sample())
            self._stop.wait(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.running.sample())

    def window(self, start: float, end: float) -> dict[str, float]:
        inside = [s for s in self.samples if start <= s[0] <= end] or self.samples[-2:]
        first, last = inside[0], inside[-1]
        span = last[0] - first[0]
        return {
            "server_cpu": (last[1] - first[1]) / span if span > 0 else 0.0,
            "rss": max(s[2] for s in inside),
            "threads": max(s[3] for s in inside),
        }


def load_argv(url: str, sessions: int, action: str, *more: str) -> list[str]:
    """`openenv bench` on core 1 with the picows client, printing JSON."""
    return [
        "taskset",
        "-c",
        "1",
        str(PY.parent / "openenv"),
        "bench",
        url,
        "--sessions",
        str(sessions),
        "--action",
        action,
        "--json",
        "--client",
        "picows",
        *more,
    ]


def bench(url: str, sessions: int, duration: float, action: str, *more: str) -> dict[str, Any]:
    argv = load_argv(url, sessions, action, "--duration", str(duration), "--warmup", *more)
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if not out.stdout.strip():
        raise RuntimeError(f"bench failed: {out.stderr}")
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def cpu_times() -> tuple[int, int]:
    """Clock ticks the hypervisor took from this machine, and all ticks, over every core."""
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:9]]
    return ticks[7], sum(ticks)


def steal_since(start: tuple[int, int]) -> float:
    """The share of the machine's CPU time the hypervisor took since ``start``."""
    steal, total = cpu_times()
    return (steal - start[0]) / max(1, total - start[1])


def measured(running: Running, sessions: int, duration: float, action: str) -> dict[str, Any]:
    sampler = Sampler(running)
    started = time.perf_counter()
    ticks = cpu_times()
    report = bench(running.url, sessions, duration, action)
    report["steal"] = steal_since(ticks)
    sampler.close()
    window_from = started + report["setup_s"] + 1.0 + 0.2  # after connect, reset and warmup
    report.update(sampler.window(window_from, window_from + duration - 0.4))
    return report


# -- scenarios ------------------------------------------------------------------


def throughput(names: list[str], levels: list[int], reps: int, duration: float) -> dict[str, Any]:
    chosen = [s for s in servers() if s.name in names]
    results: dict[str, dict[str, list[Any]]] = {s.name: {} for s in chosen}
    for rep in range(reps):
        order = chosen[rep % len(chosen) :] + chosen[: rep % len(chosen)]
        for server in order:
            running = Running(server)
            try:
                time.sleep(0.5)
                _, _, idle_rss, idle_threads = running.sample()
                row = results[server.name]
                row.setdefault("cold_start", []).append(running.cold_start)
                row.setdefault("idle_rss", []).append(idle_rss)
                row.setdefault("idle_threads", []).append(idle_threads)
                for level in levels:
                    report = measured(running, level, duration, ECHO_ACTION)
                    row.setdefault(f"c{level}", []).append(report)
                    print(
                        f"rep {rep + 1} {server.name:30} C={level:<4} "
                        f"{report['steps_per_s']:>9,.0f} steps/s  p99 "
                        f"{report['latency_ms']['p99']:7.2f} ms  server CPU "
                        f"{report['server_cpu']:.2f}  client CPU {report['client_cpu']:.2f}  "
                        f"steal {report['steal']:.0%}  errors {report['errors']}",
                        flush=True,
                    )
            finally:
                running.stop()
    return results


PAIRED = ("ours-def", "ours-async", "bare-starlette-uvloop-orjson")


@dataclass
class Paired:
    """What ``paired`` measured, per server name, one value per round."""

    cpu_us: dict[str, list[float]]  # server CPU per step
    p99_ms: dict[str, list[float]]  # p99 step latency meanwhile
    connect_p99_ms: dict[str, list[float]]  # p99 of its sessions' connects, all at once


def paired(rounds: int, sessions: int, duration: float) -> Paired:
    """Server CPU per step of servers sharing core 0, each under the same load at
    once, with each one's step and connect latencies.

    Measured one after another, servers meet a machine whose speed changes by
    more than the margins compared (here it switches between two regimes every
    few seconds); side by side they meet the same machine, and what each one
    spends per step is what decides its throughput alone when it is CPU-bound.
    """
    # With --baseline, that revision's servers (and plain uvicorn, ours and
    # theirs) share the core too: the fairest comparison this machine allows.
    wanted = {*PAIRED, "base-def", "base-async", "ours-plain", "base-plain"} if BASELINE else PAIRED
    chosen = [s for s in servers() if s.name in wanted]
    names = [s.name for s in chosen]
    run = Paired({n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names})
    out = run.cpu_us
    for _ in range(rounds):
        running = [Running(server) for server in chosen]
        try:
            samplers = [Sampler(r) for r in running]
            started = time.perf_counter()
            more = ("--duration", str(duration), "--warmup")
            argvs = [load_argv(r.url, sessions, ECHO_ACTION, *more) for r in running]
            loads = [subprocess.Popen(a, stdout=subprocess.PIPE, text=True) for a in argvs]
            reports = [json.loads(load.communicate(timeout=120)[0]) for load in loads]
            for sampler in samplers:
                sampler.close()
            for server, sampler, report in zip(chosen, samplers, reports, strict=True):
                if report["errors"]:
                    raise RuntimeError(f"{server.name}: errors {report['errors']}")
                window_from = started + report["setup_s"] + 1.0 + 0.2
                cpu = sampler.window(window_from, window_from + duration - 0.4)["server_cpu"]
                out[server.name].append(cpu / report["steps_per_s"] * 1e6)
                run.p99_ms[server.name].append(report["latency_ms"]["p99"])
                run.connect_p99_ms[server.name].append(report["connect_ms"]["p99"])
            print(
                "paired: " + ", ".join(f"{name} {us[-1]:.1f} us/step" for name, us in out.items()),
                flush=True,
            )
        finally:
            for r in running:
                r.stop()
        # The loads start one after another: rotate who goes first, so no server's
        # sessions always connect into the others' handshakes.
        chosen = chosen[1:] + chosen[:1]
    return run


def against_baseline(kind: str, run: Paired) -> str:
    """``ours-KIND`` against ``base-KIND`` round by round (both met the same machine)."""
    ours, base = f"ours-{kind}", f"base-{kind}"

    def change(values: dict[str, list[float]], *, per_cpu_second: bool = False) -> str:
        pairs = zip(values[ours], values[base], strict=True)
        # CPU per step compares as steps per CPU-second (base/ours); latencies as they are.
        part = [b / o - 1 if per_cpu_second else o / b - 1 for o, b in pairs]
        return ", ".join(f"{x:+.1%}" for x in part) + f" (median **{median(part):+.1%}**)"

    return (
        f"`{ours}` against `{base}`, each round: steps per server CPU-second "
        f"{change(run.cpu_us, per_cpu_second=True)}; p99 {change(run.p99_ms)}; "
        f"connects p99 {change(run.connect_p99_ms)}."
    )


def isolation(reps: int, half: int, cycles: int) -> dict[str, list[float]]:
    """The fast half's throughput with and without a slow half beside it (isolation.py),
    on a fresh server for each rep."""
    server = Server(
        "benchmark-env-def",
        "benchmark_env, `def step`",
        uvicorn(PY, "server.app:app", ROOT / "envs" / "benchmark_env", "--ws", OPENENV_WS),
    )
    out: dict[str, list[float]] = {
        "alone": [],
        "beside_slow": [],
        "slow": [],
        "change": [],
        "arrival": [],
    }
    for rep in range(reps):
        running = Running(server)
        try:
            argv = ["taskset", "-c", "1", str(PY), str(BENCH_DIR / "isolation.py"), running.url]
            argv += ["--sessions", str(half), "--cycles", str(cycles)]
            argv += ["--on", "1.5", "--off", "1.5"]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"isolation.py failed: {done.stderr}")
            result = json.loads(done.stdout)
            if result["errors"]:
                raise RuntimeError(f"isolation run had {result['errors']} errors")
            out["alone"].append(result["alone"])
            out["beside_slow"].append(result["beside_slow"])
            out["slow"].append(result["slow"])
            out["change"] += result["changes"]
            out["arrival"].append(result["arrival_change"])
            print(
                f"isolation rep {rep + 1}: alone {result['alone']:,.0f} beside "
                f"{result['beside_slow']:,.0f} steps/s; changes "
                + ", ".join(f"{c:+.1%}" for c in result["changes"]),
                flush=True,
            )
        finally:
            running.stop()
    return out


def scale(sessions: int, seconds: float, app: str) -> dict[str, Any]:
    """Sessions that connect, reset, take one step sleeping `seconds`, and close."""
    server = Server(
        f"benchmark-env {app}",
        "",
        uvicorn(PY, app, ROOT / "envs" / "benchmark_env", "--ws", OPENENV_WS),
    )
    running = Running(server, max_sessions=sessions)
    try:
        sampler = Sampler(running)
        argv = load_argv(
            running.url,
            sessions,
            json.dumps({"seconds": seconds}),
            "--steps",
            "1",
            "--connect-timeout",
            "60",
            "--reply-timeout",
            str(seconds + 60),
        )
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
        sampler.close()
        report: dict[str, Any] = json.loads(out.stdout)
        report["server_rss_max"] = max(s[2] for s in sampler.samples)
        report["server_threads_max"] = max(s[3] for s in sampler.samples)
        return report
    finally:
        running.stop()


# -- output -------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def machine_load() -> str:
    load = os.getloadavg()
    return (
        f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min) "
        f"on {os.cpu_count()} cores"
    )


def table(results: dict[str, Any], levels: list[int]) -> list[str]:
    names = {s.name: s.what for s in servers()}
    lines = []
    for level in levels:
        lines += [
            f"**C = {level}** (closed loop, medians)",
            "",
            "| server | steps/s | p50 ms | p99 ms | server CPU | client CPU | steal "
            "| steps per server CPU-s | x OpenEnv | x bare uvloop+orjson |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        med = {
            name: {
                k: median([r[k] if not isinstance(r[k], dict) else 0 for r in row[f"c{level}"]])
                for k in ("steps_per_s", "server_cpu", "client_cpu", "steal")
            }
            | {
                "per_cpu": median(
                    [r["steps_per_s"] / max(r["server_cpu"], 1e-9) for r in row[f"c{level}"]]
                )
            }
            | {q: median([r["latency_ms"][q] for r in row[f"c{level}"]]) for q in ("p50", "p99")}
            for name, row in results.items()
        }
        core = med.get("openenv-core", {}).get("steps_per_s")
        floor = med.get("bare-starlette-uvloop-orjson", {}).get("steps_per_s")
        for name, m in med.items():
            ratio_core = f"{m['steps_per_s'] / core:.2f}" if core else "-"
            ratio_floor = f"{m['steps_per_s'] / floor:.2f}" if floor else "-"
            lines.append(
                f"| {name}: {names[name]} | {m['steps_per_s']:,.0f} | {m['p50']:.2f} | "
                f"{m['p99']:.2f} | {m['server_cpu']:.2f} | {m['client_cpu']:.2f} | "
                f"{m['steal']:.0%} | {m['per_cpu']:,.0f} | {ratio_core} | {ratio_floor} |"
            )
        lines.append("")
    big = max(levels)
    lines += [
        f"**Memory, threads, start-up, connects** (medians; the C={big} columns are "
        "sampled during that run)",
        "",
        f"| server | cold start to /health | idle RSS | RSS/session at {big} "
        f"| threads idle / at {big} | {big} connects: p99 | all {big} ready |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in results.items():
        runs = row[f"c{big}"]
        idle = median(row["idle_rss"])
        per = median([(r["rss"] - i) / big for r, i in zip(runs, row["idle_rss"], strict=True)])
        lines.append(
            f"| {name} | {median(row['cold_start']) * 1000:.0f} ms | {idle / 2**20:.1f} MiB | "
            f"{per / 1024:.1f} KiB | {median(row['idle_threads']):.0f} / "
            f"{median([r['threads'] for r in runs]):.0f} | "
            f"{median([r['connect_ms']['p99'] for r in runs]):.0f} ms | "
            f"{median([r['setup_s'] for r in runs]) * 1000:.0f} ms |"
        )
    return lines


def write_results(lines: list[str]) -> None:
    path = BENCH_DIR / "RESULTS.md"
    text = (
        path.read_text() if path.exists() else f"# Benchmark results\n\n{MARK_BEGIN}\n{MARK_END}\n"
    )
    head, rest = text.split(MARK_BEGIN, 1)
    tail = rest.split(MARK_END, 1)[1]
    path.write_text(head + MARK_BEGIN + "\n" + "\n".join(lines) + "\n" + MARK_END + tail)


def export_src(rev: str) -> Path:
    """``src/`` as it was at ``rev``, exported beside the benchmarks (gitignored)."""
    target = BENCH_DIR / f".baseline-{rev}"
    if not target.exists():
        target.mkdir()
        archive = subprocess.run(
            ["git", "archive", rev, "src"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "src"


def precompile(*dirs: Path) -> None:
    """Write the bytecode every server would have after ``pip install``."""
    for path in dirs:
        compileall.compile_dir(path, quiet=1)


def ensure_openenv_core() -> None:
    python = OPENENV_CORE_VENV / "bin" / "python"
    if python.exists():
        return
    print(f"installing {OPENENV_CORE} into {OPENENV_CORE_VENV} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(OPENENV_CORE_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", OPENENV_CORE], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--levels", default="16,512")
    parser.add_argument("--only", default="", help="comma list of server names (default: all)")
    parser.add_argument("--scale-sessions", type=int, default=16384)
    parser.add_argument(
        "--skip", default="", help="comma list of: throughput,paired,isolation,scale"
    )
    parser.add_argument("--no-write", action="store_true", help="print, do not touch RESULTS.md")
    parser.add_argument("--baseline", default="", help="also run our servers at this git revision")
    args = parser.parse_args()
    if args.baseline:
        BASELINE[args.baseline] = export_src(args.baseline)
    skip = set(filter(None, args.skip.split(",")))
    names = args.only.split(",") if args.only else [s.name for s in servers()]
    levels = [int(x) for x in args.levels.split(",")]
    command = "python benchmarks/run.py " + shlex.join(sys.argv[1:])
    if "openenv-core" in names and "throughput" not in skip:
        ensure_openenv_core()
    precompile(ROOT / "src", ROOT / "envs", BENCH_DIR / "servers", *BASELINE.values())
    LOG_DIR.mkdir(exist_ok=True)
    started = time.time()
    ticks = cpu_times()
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))} with `{command.strip()}`",
        f"(`make bench`). Machine at start: {machine_load()}.",
        "",
    ]
    if "throughput" not in skip:
        lines += table(throughput(names, levels, args.reps, args.duration), levels)
    if "paired" not in skip:
        run = paired(args.reps, 512, args.duration)
        costs = run.cpu_us
        bare = median(costs["bare-starlette-uvloop-orjson"])
        first = len(lines)
        lines += [
            "**Side by side** (C=512): "
            + ", ".join(f"`{name}`" for name in costs)
            + " on core 0 at once, each under its own load generator on core 1, "
            f"{args.reps} rounds; server CPU per step, medians, and the steps each makes per "
            "server CPU-second against the bare echo's; p99 step latency meanwhile, and "
            "the p99 of the 512 connects (every server's at once)",
            "",
            "| server | CPU per step | each round | x bare uvloop+orjson | p99 ms | connects p99 |",
            "|---|---:|---|---:|---:|---:|",
            *(
                f"| {name} | {median(us):.1f} us | {', '.join(f'{u:.1f}' for u in us)} | "
                f"{bare / median(us):.2f} | {median(run.p99_ms[name]):.1f} | "
                f"{median(run.connect_p99_ms[name]):.0f} ms |"
                for name, us in costs.items()
            ),
            "",
        ]
        for kind in ("def", "async", "plain"):
            if f"base-{kind}" in costs:
                lines += [against_baseline(kind, run), ""]
        print("\n".join(lines[first:]), flush=True)
    if "isolation" not in skip:
        iso = isolation(args.reps, 256, cycles=12)
        alone, beside = median(iso["alone"]), median(iso["beside_slow"])
        changes = sorted(iso["change"])
        lines += [
            "**Slow-environment isolation** (benchmark_env, `def step`; "
            "`benchmarks/isolation.py`): 256 sessions with an instant step run throughout; "
            "beside them, 256 sessions whose step sleeps 100 ms (`time.sleep`) connect once, "
            "then step for 1.5 s and pause for 1.5 s, 12 times; "
            f"{args.reps} fresh servers. Each on window is compared with the mean of the off "
            "windows either side of it; *arrival* is the fast half in the first second after "
            "the connected slow half first steps, against the off window before it",
            "",
            "| fast half alone | fast half beside the slow half | change: median | "
            "middle half of the windows | all windows | slow half | arrival: median |",
            "|---:|---:|---:|---|---|---:|---:|",
            f"| {alone:,.0f} steps/s | {beside:,.0f} steps/s | {median(changes):+.1%} | "
            f"{changes[len(changes) // 4]:+.1%} to {changes[(3 * len(changes)) // 4]:+.1%} | "
            f"{changes[0]:+.1%} to {changes[-1]:+.1%} | {median(iso['slow']):,.0f} steps/s | "
            f"{median(iso['arrival']):+.1%} |",
            "",
        ]
        print(lines[-2], flush=True)
    if "scale" not in skip:
        report = scale(args.scale_sessions, 10.0, "server.app:async_app")
        ok = report["sessions_ok"] / report["sessions"]
        lines += [
            f"**Scale**: {report['sessions']:,} sessions of benchmark_env (`async def step`, "
            "`asyncio.sleep(10)`): connect, reset, one step, close",
            "",
            "| succeeded | step p50 | step p99 | all connected and reset "
            "| server RSS max | server threads max | errors |",
            "|---:|---:|---:|---:|---:|---:|---|",
            f"| {ok:.2%} | {report['latency_ms']['p50'] / 1000:.2f} s | "
            f"{report['latency_ms']['p99'] / 1000:.2f} s | {report['setup_s']:.2f} s | "
            f"{report['server_rss_max'] / 2**20:.0f} MiB | {report['server_threads_max']} | "
            f"{report['errors'] or 'none'} |",
            "",
        ]
        print(lines[-2], flush=True)
    lines.append(
        f"Machine at end: {machine_load()}; the hypervisor took {steal_since(ticks):.1%} of "
        f"its CPU time (steal); took {time.time() - started:.0f} s."
    )
    print("\n".join(lines))
    if not args.no_write:
        write_results(lines)


if __name__ == "__main__":
    main()
