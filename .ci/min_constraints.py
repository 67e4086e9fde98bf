"""Print a pip constraints file pinning every dependency to the floor pyproject.toml declares.

`make test-min` installs with it, so the floors are the versions a test job
really ran, not wishes. Only runtime dependencies and the extras users install
are pinned; the dev tools (pytest, ruff, mypy, playwright) are ours, not theirs.

    python .ci/min_constraints.py ray spark mcp bench gymnasium report parquet
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def floors(extras: list[str]) -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    specs = list(project["dependencies"])
    for extra in extras:
        specs += project["optional-dependencies"][extra]
    pins = []
    for spec in specs:
        requirement, _, marker = spec.partition(";")
        match = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([^,\s]+)", requirement)
        if match is None:
            raise SystemExit(f"no floor (>=) in {spec!r}: every dependency needs one")
        pin = f"{match.group(1)}=={match.group(3)}"
        pins.append(f"{pin}; {marker.strip()}" if marker else pin)
    return pins


if __name__ == "__main__":
    print("\n".join(floors(sys.argv[1:])))
