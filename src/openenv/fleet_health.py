"""A fleet's look at its replicas' ``/health``: every replica asked at once.

Asked one after another, a replica that does not answer (its process stopped,
its event loop blocked, its node dropping packets) held up every replica
behind it for the whole timeout, each time the fleet looked: the directory's
counts and the scaling decisions lagged for all of them. Here each replica is
asked in a thread of its own, and a check still unanswered after the fleet's
wait is left running and collected at a later look, not asked again meanwhile.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait

import httpx

from openenv import protocol

__all__ = ["HealthChecks"]

# Threads asking at once: a check takes a few ms, or its timeout when hung.
_THREADS = 16


class HealthChecks:
    """Each replica's ``GET /health``, asked concurrently, at most one at a time per
    replica (keyed by the caller: the fleet uses its actor's ``id``). Used by
    one thread, the fleet's control loop.

    Args:
        timeout: Seconds a replica has to answer before it counts as not serving.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._threads = ThreadPoolExecutor(_THREADS, thread_name_prefix="openenv-fleet-health")
        self._asked: dict[int, tuple[str, Future[protocol.Health]]] = {}

    def ask(self, key: int, url: str) -> None:
        """Ask the server at ``url`` for its health, unless it is being asked already."""
        asked = self._asked.get(key)
        if asked is None or asked[0] != url:  # a restarted replica listens on a new port
            self._asked[key] = (url, self._threads.submit(self._health, url))

    def answers(self, seconds: float) -> dict[int, tuple[str, protocol.Health | BaseException]]:
        """The checks answered, waiting up to ``seconds`` for the rest (less if all
        answer sooner): by key, the URL asked and its health or why it failed."""
        wait([future for _, future in self._asked.values()], timeout=seconds)
        done: dict[int, tuple[str, protocol.Health | BaseException]] = {}
        for key, (url, future) in list(self._asked.items()):
            if future.done():
                del self._asked[key]
                failed = future.exception()
                done[key] = (url, future.result() if failed is None else failed)
        return done

    def forget(self, key: int) -> None:
        """Drop a replica that is gone (its check, if any, ends unread)."""
        self._asked.pop(key, None)

    def close(self) -> None:
        """Ask no more; a check in flight ends by its timeout."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _health(self, url: str) -> protocol.Health:
        answer = httpx.get(f"{url}/health", timeout=self.timeout)
        return protocol.Health.model_validate_json(answer.content)
