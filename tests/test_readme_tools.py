"""The README's "Tools and tasks" example runs as written, against a real server."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import re
import sys
from pathlib import Path

from mcp import Client

from openenv.testing import run_server

README = Path(__file__).parents[1] / "README.md"


def _section_blocks() -> list[str]:
    section = README.read_text().split("## Tools and tasks", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```py\n(.*?)```", section, flags=re.DOTALL)


def test_readme_tool_environment_serves_tasks_tools_and_mcp(tmp_path: Path) -> None:
    env_code, client_code = _section_blocks()
    (tmp_path / "count_env.py").write_text(env_code)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("count_env")
        with run_server(module.app) as url:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = client_code.replace("http://localhost:8000", url)
                exec(compile(code, "README.md", "exec"), {"__name__": "readme"})

            async def over_mcp() -> list[object]:
                async with Client(f"{url}/mcp") as mcp:
                    await mcp.call_tool("increment", {"amount": 1})
                    result = await mcp.call_tool("submit", {})
                    return [result.structured_content]

            assert asyncio.run(over_mcp()) == [{"reward": 1.0, "finished": True}]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("count_env", None)
    assert out.getvalue().splitlines() == ["500 episodes, mean reward 1.0"]
