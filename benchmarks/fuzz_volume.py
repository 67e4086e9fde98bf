"""Fuzz volume: many hypothesis-generated frames against a real server.

Runs tests/test_fuzz.py with a large example budget and reports how many
frames were tried, how many sessions they took, crashes and leaked slots.

    .venv/bin/python benchmarks/fuzz_volume.py --examples 20000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "fuzz.json"
        env = {
            **os.environ,
            "OPENENV_FUZZ_EXAMPLES": str(args.examples),
            "OPENENV_FUZZ_REPORT": str(report),
        }
        started = time.perf_counter()
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_fuzz.py"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - started
        if run.returncode != 0 or not report.exists():
            print(run.stdout[-4000:], run.stderr[-2000:])
            raise SystemExit("fuzzing found a failure (see above)")
        summary = json.loads(report.read_text())
    print(
        f"fuzz: {summary['frames']:,} frames over {summary['sessions']:,} sessions "
        f"in {elapsed:.0f}s; server crashes 0; malformed replies 0; "
        f"leaked slots {summary['leaked_slots']}"
    )


if __name__ == "__main__":
    main()
