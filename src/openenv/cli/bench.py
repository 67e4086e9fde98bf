"""``openenv bench``: closed-loop load against a running server, with a live progress line."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from openenv.cli.errors import fail
from openenv.errors import ConnectionFailedError

if TYPE_CHECKING:
    from openenv.bench import BenchProgress, BenchReport

__all__ = ["bench", "render"]


def bench(
    url: Annotated[
        str,
        typer.Argument(
            help="The server: http://host:port or ws://host:port/ws; several joined by "
            "commas spread the sessions over them by free room."
        ),
    ],
    sessions: Annotated[
        int, typer.Option("--sessions", "-c", min=1, help="Concurrent sessions.")
    ] = 16,
    steps: Annotated[
        int | None, typer.Option("--steps", "-s", min=1, help="Measured steps per session.")
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option("--duration", "-d", min=0.001, help="Seconds to measure (default 10)."),
    ] = None,
    warmup: Annotated[
        bool, typer.Option("--warmup", help="Step for 1 s before measuring, uncounted.")
    ] = False,
    action: Annotated[
        str | None,
        typer.Option(
            "--action",
            "-a",
            help='Every step\'s action, as JSON: \'{"message": "hi"}\' '
            "(default: one drawn from the server's /schema).",
        ),
    ] = None,
    client: Annotated[
        str, typer.Option(help="Load generator: auto (picows if installed), picows, websockets.")
    ] = "auto",
    connect_timeout: Annotated[float, typer.Option(min=0.001, help="Seconds to connect.")] = 30.0,
    reply_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds to await a reply.")
    ] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Drive a server with closed-loop sessions; print steps/s, latency and errors.

    Each session connects, resets, then sends a step and waits for its reply,
    again and again. Exits 1 if any session failed.
    """
    from openenv.bench import run_bench

    if steps is not None and duration is not None:
        raise typer.BadParameter("pass --steps or --duration, not both")
    parsed = None
    if action is not None:
        try:
            parsed = orjson.loads(action)
        except orjson.JSONDecodeError as exc:
            raise typer.BadParameter(f"--action is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise typer.BadParameter("--action must be a JSON object")
    err = Console(stderr=True)
    options: dict[str, Any] = {"notice": lambda line: err.print(f"[yellow]warning:[/] {line}")}
    if err.is_terminal:
        options["progress"] = lambda p: _progress_line(err, p)
    try:
        report = run_bench(
            url,
            sessions=sessions,
            steps=steps,
            duration=duration,
            warmup=1.0 if warmup else 0.0,
            action=parsed,
            client=client,
            connect_timeout=connect_timeout,
            reply_timeout=reply_timeout,
            **options,
        )
    except (ValueError, ImportError) as exc:
        fail(exc, 2)
    except ConnectionFailedError as exc:
        fail(exc, 1)
    finally:
        if err.is_terminal:
            err.file.write("\r\033[K")
    if as_json:
        sys.stdout.write(orjson.dumps(report.to_dict()).decode() + "\n")
    else:
        render(report, Console())
    if report.sessions_failed:
        raise typer.Exit(1)


def _progress_line(console: Console, p: BenchProgress) -> None:
    line = (
        f"{p.phase:<10} {p.elapsed:6.1f}s  sessions {p.ready}/{p.sessions}  "
        f"replies {p.replies:,}  {p.rate:,.0f}/s  errors {p.errors:,}"
    )
    console.file.write(f"\r\033[K{line}")
    console.file.flush()


def render(report: BenchReport, console: Console) -> None:
    """Print a report as a table."""
    table = Table(title=f"openenv bench {report.url}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("sessions", f"{report.sessions:,} ({report.sessions_failed:,} failed)")
    table.add_row("steps", f"{report.steps:,} in {report.elapsed:.2f} s")
    table.add_row("steps/s", f"{report.steps_per_second:,.0f}")
    for q in (50, 90, 99):
        table.add_row(f"p{q} latency", f"{report.latency(q) * 1000:.2f} ms")
    table.add_row("max latency", f"{report.latency(100) * 1000:.2f} ms")
    connect = " / ".join(f"{report.connect_time(q) * 1000:.1f}" for q in (50, 90, 99))
    table.add_row("connect p50/p90/p99", f"{connect} ms")
    table.add_row("all sessions ready", f"{report.setup_time:.3f} s")
    table.add_row("load generator CPU", f"{report.client_cpu:.0%} of a core ({report.client})")
    errors = ", ".join(f"{code}: {n:,}" for code, n in report.errors.most_common()) or "none"
    table.add_row("errors", errors)
    console.print(table)
    for code, message in report.error_samples.items():
        console.print(f"  [dim]{code}: {message}[/]")
