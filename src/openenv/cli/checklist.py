"""The result of ``openenv validate``: named checks, each passed, failed, warned or skipped."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

__all__ = ["Check", "Checklist", "Status"]

Status = Literal["pass", "fail", "warn", "skip"]

_MARKS: dict[str, str] = {
    "pass": "[green]✓[/]",
    "fail": "[red]✗[/]",
    "warn": "[yellow]![/]",
    "skip": "[dim]-[/]",
}


@dataclass(frozen=True)
class Check:
    """One line of the checklist."""

    name: str
    status: Status
    detail: str = ""


@dataclass
class Checklist:
    """Checks run against one target (a folder or a URL); failed if any check failed.

    >>> report = Checklist("envs/echo_env")
    >>> report.add("layout", "pass", "all files present")
    >>> report.add("tests", "warn", "no tests/ folder")
    >>> report.ok, report.summary()
    (True, 'all checks passed (1 warning)')
    >>> report.add("app", "fail", "server/app.py raised")
    >>> report.ok, report.summary()
    (False, '1 of 3 checks failed')
    """

    target: str
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: Status, detail: str = "") -> None:
        self.checks.append(Check(name, status, detail))

    @property
    def ok(self) -> bool:
        return all(check.status != "fail" for check in self.checks)

    def count(self, status: Status) -> int:
        return sum(check.status == status for check in self.checks)

    def summary(self) -> str:
        failed, warned = self.count("fail"), self.count("warn")
        if failed:
            return f"{failed} of {len(self.checks)} checks failed"
        text = "all checks passed"
        if warned:
            text += f" ({warned} warning{'s' if warned > 1 else ''})"
        return text

    def to_json(self) -> dict[str, Any]:
        """The report for machines (``openenv validate --json``)."""
        return {"target": self.target, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}

    def render(self, console: Console) -> None:
        """Print one line per check, then the summary."""
        console.print(f"[bold]{escape(self.target)}[/]", soft_wrap=True)
        width = max((len(check.name) for check in self.checks), default=0)
        for check in self.checks:
            detail = escape(check.detail)
            console.print(
                f"  {_MARKS[check.status]} {check.name:<{width}}  {detail}", soft_wrap=True
            )
        colour = "green" if self.ok else "red"
        console.print(f"[{colour}]{self.summary()}[/]")
