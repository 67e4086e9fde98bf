"""``openenv serve PATH --ray``: the environment as a fleet of replicas on a Ray cluster."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import typer

from openenv.cli.app_loader import AppLoadError

__all__ = ["serve_fleet"]


def serve_fleet(path: Path, *, host: str, port: int, **options: Any) -> None:
    """Start a ``Fleet``, print its directory's address, run until SIGINT or SIGTERM."""
    try:
        from openenv.fleet import Fleet
    except ImportError:  # pragma: no cover - ray is an extra
        typer.echo("error: --ray needs Ray: pip install 'openenv-scale[ray]'", err=True)
        raise typer.Exit(1) from None
    if not (path / "server" / "app.py").is_file():
        typer.echo(f"error: {path.resolve()} has no server/app.py", err=True)
        raise typer.Exit(1)
    fleet = Fleet(path, host=host, port=port, **options)
    stop = threading.Event()
    starting = True

    def on_signal(sig: int, frame: object) -> None:
        stop.set()
        if starting:
            # Starting may take minutes (an app that hangs on import, a cluster
            # with no room): the signal ends it, not waits for it.
            raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        url = fleet.start()
        starting = False
    except AppLoadError as exc:  # as `openenv serve` says it, before anything serves
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("interrupted while the fleet was starting; stopping it", err=True)
        fleet.stop()  # start() stops what it started; this, if it had just returned
        return
    try:
        typer.echo(
            f"fleet of {fleet.replicas} replica(s) of {path} (scaling "
            f"{fleet.min_replicas}..{fleet.max_replicas}); clients: ServerPool({url!r}) "
            f"or openenv run --env {url},; Ctrl+C to stop"
        )
        stop.wait()
    finally:
        fleet.stop()
