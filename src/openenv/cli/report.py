"""``openenv report RESULTS``: the HTML report of a run's results file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["report_command"]

HINT = "the report draws with matplotlib: pip install 'openenv-scale[report]'"


def report_command(
    results: Annotated[
        Path, typer.Argument(help="A results file (JSON Lines) from `openenv run --out`.")
    ],
    out: Annotated[
        Path | None, typer.Option(help="Where to write the HTML (default: beside RESULTS).")
    ] = None,
) -> None:
    """Write one self-contained HTML page of charts about a run: rewards, success, errors."""
    try:
        from openenv.report import write_report

        written = write_report(results, out)
    except ImportError:
        typer.echo(f"error: {HINT}", err=True)
        raise typer.Exit(1) from None
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"report: {written}")
