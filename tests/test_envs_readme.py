"""envs/README.md lists every reference environment, with its concurrency as declared."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ENVS = Path(__file__).parents[1] / "envs"


def test_the_table_lists_every_environment_and_its_concurrency_truthfully() -> None:
    table = (ENVS / "README.md").read_text()
    rows = re.findall(r"^\| \[`(\w+)`\]\(\1/README.md\) \| .+ \| (yes|no)\b", table, re.MULTILINE)
    listed = dict(rows)
    folders = {path.parent.name for path in ENVS.glob("*/pyproject.toml")}
    assert set(listed) == folders
    for name, says in listed.items():
        app = importlib.import_module(f"{name}.server.app").app
        service = app.state.openenv
        env_cls = service.env_cls
        assert env_cls is not None, name
        assert env_cls.SUPPORTS_CONCURRENT_SESSIONS is (says == "yes"), name
        assert service.metadata.supports_concurrent_sessions is (says == "yes"), name
