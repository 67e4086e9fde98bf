"""A loop-lag watchdog: notice when something blocks the event loop, and say who.

An ``async def`` step that calls ``time.sleep`` (or any blocking function)
stops every session of the server, ``/health`` included, for as long as it
runs. A callback on the loop stamps the time every ``interval`` seconds; a
thread checks the stamp, and once it is older than ``threshold`` logs a
warning naming the task the loop is running (for a session, its id), so the
culprit shows in the log while it still blocks. ``recent_block`` keeps the
last one for ``/health`` to report.

>>> import asyncio, time
>>> async def main() -> bool:
...     dog = LoopWatchdog(threshold=0.05, interval=0.01)
...     dog.start(asyncio.get_running_loop())
...     await asyncio.sleep(0.05)
...     time.sleep(0.3)  # blocks the loop
...     await asyncio.sleep(0.05)
...     dog.stop()
...     return dog.recent_block(within=60) is not None
>>> asyncio.run(main())
True
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["LoopWatchdog"]

logger = logging.getLogger("openenv.server")


class LoopWatchdog:
    """Warns (once per stall) when the event loop has not run for ``threshold`` seconds."""

    def __init__(
        self,
        threshold: float = 1.0,
        interval: float = 0.1,
        describe: Callable[[asyncio.Task[object] | None], str] | None = None,
    ) -> None:
        self.threshold = threshold
        self.interval = interval
        self._describe = describe or _task_name
        self._tick = time.monotonic()
        self._stop = threading.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last: tuple[float, float, str] | None = None  # (ended, seconds, who)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._stop.clear()
        self._tick = time.monotonic()
        self._timer = loop.call_later(self.interval, self._stamp)
        threading.Thread(target=self._watch, name="openenv-loop-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def recent_block(self, within: float = 30.0) -> str | None:
        """What blocked the loop last, if that ended less than ``within`` seconds ago."""
        last = self._last
        if last is None:
            return None
        blocked_since = time.monotonic() - self._tick
        if blocked_since > self.threshold:  # blocked right now (a thread asks)
            return f"event loop blocked for {blocked_since:.1f}s ({last[2]})"
        if last[0] and time.monotonic() - last[0] > within:
            return None
        return f"event loop was blocked for {last[1]:.1f}s ({last[2]})"

    def _stamp(self) -> None:
        now = time.monotonic()
        last = self._last
        if last is not None and last[0] == 0.0:  # the stall the thread reported has ended
            self._last = (now, now - self._tick, last[2])
        self._tick = now
        if self._loop is not None and not self._stop.is_set():
            self._timer = self._loop.call_later(self.interval, self._stamp)

    def _watch(self) -> None:
        reported = 0.0
        while not self._stop.wait(self.interval):
            tick = self._tick
            if time.monotonic() - tick < self.threshold or tick == reported:
                continue
            reported = tick
            loop = self._loop
            # Read from another thread: the loop is stuck inside this task's step.
            task = asyncio.current_task(loop) if loop is not None else None
            who = self._describe(task)
            self._last = (0.0, time.monotonic() - tick, who)
            if who.startswith("session "):
                logger.warning(
                    "the event loop has been blocked for over %gs by %s: every session "
                    "waits. An async def environment method must not call blocking "
                    "functions (time.sleep, requests, ...); make it a plain def, or await "
                    "instead",
                    self.threshold,
                    who,
                )
            else:  # not environment code: the server's own work, e.g. a burst of handshakes
                logger.warning(
                    "the event loop has been busy for over %gs in %s (no session's code): "
                    "every session waits. A burst of new connections does this; so does "
                    "blocking code outside the environment",
                    self.threshold,
                    who,
                )


def _task_name(task: asyncio.Task[object] | None) -> str:
    return "a callback outside any task" if task is None else f"task {task.get_name()}"
