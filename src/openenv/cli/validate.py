"""``openenv validate``: check an environment folder, or a running server, and say what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from openenv.cli.validate_folder import validate_folder
from openenv.cli.validate_url import validate_url

__all__ = ["validate_command", "validate_folder", "validate_url"]


def validate_command(
    path: Annotated[
        Path | None,
        typer.Argument(help="The environment folder to check (default: this folder)."),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option("--url", help="Check a running server instead, e.g. http://127.0.0.1:8000."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds to wait for each answer from --url.")
    ] = 10.0,
) -> None:
    """Check an environment folder, or a running server with --url; exit 1 on any failure.

    A folder: layout, pyproject entry point, server/app.py imports, factory (not
    an instance), session cap vs SUPPORTS_CONCURRENT_SESSIONS. A server: /health,
    /metadata, /schema, and a real /ws episode (reset, step, state, close), with
    the API key in $OPENENV_API_KEY if the server needs one.
    """
    if path is not None and url is not None:
        typer.echo("error: give a folder or --url, not both", err=True)
        raise typer.Exit(1)
    report = validate_url(url, timeout=timeout) if url else validate_folder(path or Path("."))
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        report.render(Console(highlight=False))
    raise typer.Exit(0 if report.ok else 1)
