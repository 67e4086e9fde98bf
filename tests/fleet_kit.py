"""What the multi-node tests share: a two-node Ray cluster, the environment
folders, and polling a fleet's directory."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ECHO = Path(__file__).parents[1] / "envs" / "echo_env"
COUNTER = ECHO.parent / "counter_env"


@contextlib.contextmanager
def two_node_cluster(each_node: dict[str, float] | None = None) -> Iterator[Any]:
    """A head and a worker node (Ray's own test utility), 2 CPUs each, this
    process connected to it; the ``Cluster``, whose nodes a test may remove.

    ``each_node``: custom resources both nodes have, for a test that must
    know where Ray places what (its SPREAD strategy is only a preference)."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        ray.shutdown()
    memory = 100 * 2**20
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "include_dashboard": False,
            "object_store_memory": memory,
            "resources": {"head_slot": 100, **(each_node or {})},  # head_slot: what a fleet holds
        },
    )
    cluster.add_node(num_cpus=2, object_store_memory=memory, resources=each_node or {})
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def until(condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds}s"
        time.sleep(0.1)


def replicas(url: str) -> list[dict[str, Any]]:
    """Every replica a fleet's directory lists, whatever its status."""
    listed: list[dict[str, Any]] = httpx.get(f"{url}/replicas").json()["replicas"]
    return listed


def healthy(url: str) -> list[dict[str, Any]]:
    return [r for r in replicas(url) if r["status"] == "healthy"]
