"""The garbage collector tuned for serving: a process-wide setting, made only when asked.

``openenv serve`` (and ``openenv.serve``) asks for it by default, since it
owns the process; ``create_app`` leaves the collector alone unless its
settings say ``gc_threshold=...``, because an app may live in a process it
does not own (a test, a notebook, another framework's server).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

__all__ = ["DEFAULT_GC_THRESHOLD", "tune_gc", "unchanged"]

# Allocations between young collections while serving (CPython's default: 700).
DEFAULT_GC_THRESHOLD = 20_000


def tune_gc(threshold: int | None) -> Callable[[], None]:
    """Collect young objects less often, and never scan what startup allocated.

    Each step allocates a few dozen short-lived containers, and with hundreds
    of sessions in flight many of them are still alive at a collection, so
    CPython's default (a young collection every 700 allocations) promotes
    them and runs costly full collections over every session's objects: 10-15%
    of a busy server's CPU and its worst latencies (see benchmarks/RESULTS.md).
    Returns what undoes it. ``None``, or a threshold already in place, changes
    nothing.
    """
    before = gc.get_threshold()
    if threshold is None or before[0] >= threshold:
        return unchanged
    gc.freeze()  # the app, its modules and models: scanned by no collection from now on
    gc.set_threshold(threshold, *before[1:])

    def restore() -> None:
        gc.unfreeze()
        gc.set_threshold(*before)

    return restore


def unchanged() -> None:
    """What undoes a setting that was not changed: nothing."""
