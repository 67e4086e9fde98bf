"""A task's timeout on a worker whose episode starts late: a slow import, a cold process.

The driver watches each task on a worker process: if the worker has not
reported the task's timeout shortly after it is due, its loop is taken for
blocked, the worker is killed and its other episodes are played again. The
worker's own clock for a task starts when the episode does, after the
process has started and the task (and so its agent's module) is unpickled;
the driver's started when it handed the task out. An agent whose module
takes seconds to import (torch, transformers) made every timeout on a fresh
worker look like a blocked loop.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from runtime_agents import Gated, append_line, echo_agent

from echo_env.server.app import app as echo_app
from openenv.runtime import RunConfig, Runners, Task
from openenv.testing import run_server

ENGINES = {
    "processes": {"engine_name": "local", "worker_num": 1, "reuse_process": False},
    "ray": {"engine_name": "ray", "worker_num": 1},
    "spark": {"engine_name": "spark", "worker_num": 1},
}
TIMEOUT = 3.0
# Past the driver's half-second grace, well inside the task's timeout.
IMPORT_SECONDS = 1.5


@pytest.fixture
def slow_module(tmp_path: Path) -> Iterator[ModuleType]:
    """A module of agents that takes ``IMPORT_SECONDS`` to import, as a heavy library does."""
    name = f"slow_agents_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "import asyncio\n"
        "import time\n"
        f"time.sleep({IMPORT_SECONDS})  # a heavy import: the module's first import in a process\n"
        "\n"
        "async def hanging(session):\n"
        "    await session.reset()\n"
        "    await asyncio.Event().wait()\n"
    )
    sys.path.insert(0, str(tmp_path))  # the worker process is given the driver's path
    try:
        yield __import__(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def engine_config(request: pytest.FixtureRequest, name: str, **options: Any) -> RunConfig:
    if name in ("ray", "spark"):
        request.getfixturevalue("ray_cluster" if name == "ray" else "spark_context")
    return RunConfig(**ENGINES[name], progress=False, **options)


@pytest.mark.parametrize("name", list(ENGINES))
async def test_a_timeout_after_a_slow_import_costs_the_worker_s_other_episodes_nothing(
    request: pytest.FixtureRequest, name: str, slow_module: ModuleType, tmp_path: Path
) -> None:
    go = str(tmp_path / "go")
    config = engine_config(request, name, max_concurrency=2)
    with run_server(echo_app) as url:
        warm = await Runners.run_task([Task(id="warm", env=url, agent=echo_agent)], config)
        assert warm[0].ok, warm[0]
        tasks = [
            Task(id="hanging", env=url, agent=slow_module.hanging, timeout=TIMEOUT),
            Task(id="innocent", env=url, agent=Gated(go)),
        ]
        results: dict[str, Any] = {}
        async for result in Runners.stream(tasks, config):
            results[result.task_id] = result
            if result.task_id == "hanging":
                append_line(go, "go")  # the innocent episode ends only now: on the same worker
    hanging, innocent = results["hanging"], results["innocent"]
    assert (hanging.status.value, hanging.attempts) == ("timeout", 1), hanging
    # Played again: the driver killed its worker, taking the timeout it had not
    # heard of yet (the worker's clock started after the import) for a blocked loop.
    assert (innocent.status.value, innocent.attempts) == ("ok", 1), innocent


@pytest.mark.parametrize("name", list(ENGINES))
async def test_a_task_whose_import_outlasts_its_timeout_still_times_out_on_time(
    request: pytest.FixtureRequest, name: str, slow_module: ModuleType
) -> None:
    """The driver's watch still covers a worker that never gets to start the episode."""
    config = engine_config(request, name)
    with run_server(echo_app) as url:
        task = Task(id="late", env=url, agent=slow_module.hanging, timeout=IMPORT_SECONDS / 3)
        results = await asyncio.wait_for(Runners.run_task([task], config), 60)
    assert results[0].status.value == "timeout", results[0]
