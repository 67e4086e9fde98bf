"""The ``openenv`` command line: a thin layer over the Python API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

import openenv
from openenv.cli.bench import bench
from openenv.cli.errors import fail
from openenv.cli.report import report_command
from openenv.cli.run import run as run_episodes
from openenv.cli.scaffold import init_command
from openenv.cli.serve import serve_command
from openenv.cli.validate import validate_command

__all__ = ["app", "main"]

app = typer.Typer(
    name="openenv",
    help="Serve environments over WebSocket sessions and drive them at scale.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"openenv {openenv.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Serve environments over WebSocket sessions and drive them at scale."""


@app.command()
def demo(
    app_path: Annotated[
        str, typer.Option("--app", help="The ASGI app to serve, as module:attribute.")
    ] = "echo_env.server.app:app",
    app_dir: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            file_okay=False,
            help="Folder to import the app from (uvicorn --app-dir).",
        ),
    ] = None,
    sessions: Annotated[int, typer.Option(min=1, help="Concurrent sessions.")] = 256,
    steps: Annotated[int, typer.Option(min=1, help="Steps per session.")] = 50,
) -> None:
    """Serve an environment, drive it with many parallel sessions, print what happened."""
    from openenv.cli.demo import run_demo

    console = Console()
    try:
        report = run_demo(app_path, app_dir, sessions, steps, console)
    except RuntimeError as exc:
        fail(exc, 1)
    if report.failed_sessions:
        raise typer.Exit(1)


app.command("bench")(bench)
app.command(name="run")(run_episodes)
app.command("init")(init_command)
app.command("report")(report_command)
app.command("serve")(serve_command)
app.command("validate")(validate_command)


def main() -> None:
    """Entry point of the ``openenv`` script."""
    app()
