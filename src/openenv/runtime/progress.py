"""The progress display of a run: done, failed, rate and ETA, on stderr."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from openenv.runtime.task import TaskResult

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

__all__ = ["ProgressDisplay"]


class ProgressDisplay:
    """Counts finished tasks and, when enabled, draws a rich progress bar.

    >>> from openenv.runtime import TaskResult, TaskStatus
    >>> with ProgressDisplay(total=2, enabled=False) as progress:
    ...     progress.update(TaskResult(task_id="a", status=TaskStatus.OK))
    ...     progress.update(TaskResult(task_id="b", status=TaskStatus.ERROR))
    >>> progress.done, progress.failed
    (2, 1)
    """

    def __init__(
        self, total: int, enabled: bool | None = None, console: Console | None = None
    ) -> None:
        self.total = total
        self.done = 0
        self.failed = 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Self:
        if self.enabled:
            self._start()
        return self

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("episodes"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self._console or Console(stderr=True),
        )
        self._progress.start()
        self._task = self._progress.add_task("episodes", total=self.total, failed=0, rate="")

    def update(self, result: TaskResult) -> None:
        self.done += 1
        if not result.ok:
            self.failed += 1
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task, advance=1, failed=self.failed, rate=self._rate(self._task)
            )

    def _rate(self, task_id: Any) -> str:
        assert self._progress is not None
        speed = self._progress.tasks[task_id].speed
        return f"{speed:,.1f}/s" if speed else ""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
