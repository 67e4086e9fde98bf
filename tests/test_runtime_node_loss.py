"""Runners on a real two-node Ray cluster that loses a node mid-run.

The node goes as a machine does (its raylet and every process on it killed),
with episodes in flight there: each is played again on the node that is left,
and the run ends with one result per task, none lost and none twice. Each
node has room for one worker, as when workers hold a node's one GPU, so the
lost worker's replacement never finds room: the run ends without it.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_kit import two_node_cluster, until

from echo_env.models import EchoAction
from echo_env.server.environment import EchoEnvironment
from openenv.runtime import EpisodeSession, RunConfig, Runners, Task, TaskResult


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with two_node_cluster(each_node={"runner": 1}) as cluster:
        yield cluster


class StallsOnTheDoomedNode:
    """Plays an echo episode; on the node that is to be lost it leaves a mark and
    waits there for good, so the loss is sure to find episodes in flight.
    Elsewhere it ends only once that node has one: the head, whose worker
    starts first, would otherwise play every task before the other starts."""

    def __init__(self, doomed: str, marks: Path) -> None:
        self.doomed, self.marks = doomed, marks

    async def __call__(self, session: EpisodeSession) -> str:
        import ray

        node: str = ray.get_runtime_context().get_node_id()
        await session.reset()
        reply = await session.step(EchoAction(message=session.task.id))
        if node == self.doomed:
            (self.marks / session.task.id).touch()
            await asyncio.Event().wait()
        while not any(self.marks.iterdir()):  # noqa: ASYNC110 (another process marks)
            await asyncio.sleep(0.05)
        return reply.observation.echoed_message


def test_runners_on_ray_lose_no_task_when_a_node_is_lost_mid_run(
    cluster: Any, tmp_path: Path
) -> None:
    doomed = cluster.list_all_nodes()[1]  # the worker node; the head holds the driver
    agent = StallsOnTheDoomedNode(doomed.node_id, tmp_path)
    env = functools.partial(EchoEnvironment, max_steps=5)
    tasks = [Task(id=f"t{i:03}", env=env, agent=agent) for i in range(64)]
    config = RunConfig(
        engine_name="ray",
        worker_num=2,
        max_concurrency=4,
        retries=2,  # the default: each loss of its worker is an attempt
        engine_options={"num_cpus": 1, "resources": {"runner": 1}},  # one per node
        progress=False,
    )
    results: list[TaskResult] = []
    run = threading.Thread(target=lambda: results.extend(Runners.sync_run_task(tasks, config)))
    run.start()
    try:
        until(
            lambda: any(tmp_path.iterdir()) or not run.is_alive(),
            "an episode in flight on the worker node",
        )
        assert any(tmp_path.iterdir()), "no episode was played on the worker node"
        cluster.remove_node(doomed, allow_graceful=False)
    finally:
        run.join(120)
    assert not run.is_alive(), "the run ended"
    stalled = {mark.name for mark in tmp_path.iterdir()}
    assert [r.task_id for r in results] == [t.id for t in tasks]  # one result each
    assert [r.status.value for r in results] == ["ok"] * 64, {
        r.error.describe() for r in results if r.error
    }
    assert [r.value for r in results] == [t.id for t in tasks]
    replayed = {r.task_id for r in results if r.attempts > 1}
    assert stalled
    assert stalled <= replayed  # each stalled one was played again, on the head
