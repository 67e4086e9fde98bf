"""What recording costs: the same episodes against a server recording and one that is not.

`make bench-recording`: two `openenv.serve` processes of echo_env, one with
`OPENENV_RECORD` set, and `Runners` (local engine, C=64) playing N short
episodes (reset + 5 steps) against each in turn, then once more against the
plain server with `RunConfig(record=...)` (the runtime recording), A/B/C, for
`--rounds` rounds. Reports the median wall time of each side and the overheads.

Run from the repository root with the project's venv:
`.venv/bin/python benchmarks/recording.py [--episodes 10000] [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from workers import server

from echo_env.models import EchoAction
from openenv import RunConfig, Runners, Task
from openenv.runtime import EpisodeSession

ECHO = Path(__file__).resolve().parent.parent / "envs" / "echo_env"


async def five_steps(session: EpisodeSession) -> None:
    await session.reset()
    for _ in range(5):
        await session.step(EchoAction(message="hi"))


def run(url: str, episodes: int, record: str | None = None) -> float:
    tasks = [Task(id=f"t{i}", env=url, agent=five_steps) for i in range(episodes)]
    started = time.perf_counter()
    results = Runners.sync_run_task(tasks, RunConfig(max_concurrency=64, record=record))
    elapsed = time.perf_counter() - started
    if not all(r.ok for r in results):
        raise RuntimeError("episodes failed")
    return elapsed


@contextlib.contextmanager
def recording(folder: str | None) -> Iterator[None]:
    before = os.environ.get("OPENENV_RECORD")
    if folder is None:
        os.environ.pop("OPENENV_RECORD", None)
    else:
        os.environ["OPENENV_RECORD"] = folder
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OPENENV_RECORD", None)
        else:
            os.environ["OPENENV_RECORD"] = before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="oe-record-")
    runner_folder = tempfile.mkdtemp(prefix="oe-record-runner-")
    plain, recorded, by_runner = [], [], []
    try:
        # Each server reads OPENENV_RECORD as it starts: one without, one with.
        with (
            recording(None),
            server(1, 256, "server.app:app", cwd=ECHO) as (off, _),
            recording(folder),
            server(1, 256, "server.app:app", cwd=ECHO) as (on, _),
        ):
            for _ in range(args.rounds):
                plain.append(run(off, args.episodes))
                recorded.append(run(on, args.episodes))
                by_runner.append(run(off, args.episodes, runner_folder))
        lines = sum(1 for f in Path(folder).glob("*.jsonl") for _ in f.open("rb"))
        runner_lines = sum(1 for f in Path(runner_folder).glob("*.jsonl") for _ in f.open("rb"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(runner_folder, ignore_errors=True)
    a, b = statistics.median(plain), statistics.median(recorded)
    c = statistics.median(by_runner)
    print(
        f"**Recording overhead** (echo_env, `openenv.serve`, Runners C=64, {args.episodes:,} "
        f"episodes of reset + 5 steps, medians of {args.rounds} alternating rounds): "
        f"not recording {a:.2f} s, recording {b:.2f} s ({100 * (b - a) / a:+.1f}%); "
        f"{lines:,} lines recorded; recording in Runners instead (`RunConfig(record=...)`, "
        f"the same server not recording) {c:.2f} s ({100 * (c - a) / a:+.1f}%), "
        f"{runner_lines:,} lines."
    )


if __name__ == "__main__":
    main()
