"""Run a README's Python example and compare what it prints with its ``# comments``."""

from __future__ import annotations

import re
from pathlib import Path


def python_block(readme: Path) -> str:
    """The README's one Python example."""
    (block,) = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.DOTALL)
    return block


def expected_output(code: str) -> list[str]:
    """What the example says it prints: the comment after each ``print(...)``."""
    return re.findall(r"^\s*print\(.*\)\s+# (.+)$", code, flags=re.MULTILINE)
