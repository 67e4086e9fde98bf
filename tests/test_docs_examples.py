"""The guides' whole examples run as written (their fragments, which name a user's
own ``MyEnv`` or ``agent``, are shapes to copy, not programs)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).parents[1] / "docs"


def python_blocks(guide: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / guide).read_text(), flags=re.DOTALL)


def run(code: str) -> list[str]:
    """``code`` in a fresh interpreter, as a user would run the example; its printed lines."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_runners_guide_streams_every_result_as_it_finishes() -> None:
    (example,) = python_blocks("runners.md")
    lines = run(example)
    assert sorted(lines) == sorted(f"t{i} ok" for i in range(8))


def test_the_compat_guides_openenv_imports_are_all_there() -> None:
    imports = python_blocks("compat.md")[0]
    assert imports.count("import") == 5
    assert run(imports + "print(create_app.__module__, EnvClient.__name__)") == [
        "openenv.core.env_server.http_server EnvClient"
    ]
