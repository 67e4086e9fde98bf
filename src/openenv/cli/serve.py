"""``openenv serve``: run an environment folder's app with uvicorn, in one or more processes.

A WebSocket session lives in the process that accepted its connection, for as
long as the connection stays open. N worker processes share one listening
socket and one session cap: ``--max-sessions`` (``OPENENV_MAX_CONCURRENT_ENVS``)
counts the sessions of every worker together, so a client gets a session
while the server has room, whichever worker the kernel hands it to. A worker
that dies is replaced and its slots are freed (``server/slot_board.py``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from openenv.cli.app_loader import APP_MODULE, AppLoadError, imported_app

__all__ = ["ServeInfo", "serve", "serve_command"]

MAX_SESSIONS_VAR = "OPENENV_MAX_CONCURRENT_ENVS"
SESSION_TIMEOUT_VAR = "OPENENV_SESSION_TIMEOUT"


@dataclass(frozen=True)
class ServeInfo:
    """What ``serve`` is about to serve, once its socket is listening."""

    name: str
    folder: Path
    url: str
    workers: int
    sessions: int | None

    def describe(self) -> str:
        """One line for the terminal.

        >>> ServeInfo("echo", Path("envs/echo_env"), "http://127.0.0.1:8000", 2, 64).describe()
        'serving echo from envs/echo_env at http://127.0.0.1:8000 (2 workers sharing 64 sessions)'
        """
        where = f"serving {self.name} from {self.folder} at {self.url}"
        if self.sessions is None:
            return f"{where} ({self.workers} worker{'s' if self.workers > 1 else ''})"
        if self.workers == 1:
            return f"{where} (up to {self.sessions} sessions)"
        return f"{where} ({self.workers} workers sharing {self.sessions} sessions)"


def serve(
    path: str | Path = ".",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    max_sessions: int | None = None,
    session_timeout: float | None = None,
    reload: bool = False,
    on_ready: Callable[[ServeInfo], None] | None = None,
) -> None:
    """Serve the environment in ``path`` (its ``server/app.py``) until interrupted.

    Args:
        path: The environment folder.
        host: Interface to listen on; ``0.0.0.0`` for every interface.
        port: TCP port; 0 picks a free one (see ``ServeInfo.url``).
        workers: Server processes sharing the socket and the session cap;
            sessions stay in the process that accepted them.
        max_sessions: The session cap of the whole server, all workers together
            (default: the app's own cap). Passed as ``OPENENV_MAX_CONCURRENT_ENVS``.
        session_timeout: Idle seconds before a session is closed; passed as
            ``OPENENV_SESSION_TIMEOUT``.
        reload: Restart the server when a file in ``path`` changes (one worker).
        on_ready: Called once the socket listens, before requests are served.

    Raises:
        ValueError: the options contradict each other.
        AppLoadError: ``server/app.py`` is missing, fails to import, its
            ``app`` is not an ASGI app, or it ignores the cap or timeout asked for.
        OSError: the address cannot be listened on.
        RuntimeError: the app failed to start.
    """
    from openenv.server.protocols import default_protocols
    from openenv.server.runner import run_on_socket

    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if reload and workers > 1:
        raise ValueError("--reload runs one process; it cannot be combined with --workers")
    if session_timeout is not None and session_timeout <= 0:
        raise ValueError(f"--session-timeout must be positive, got {session_timeout}")
    folder = Path(path).resolve()
    environ: dict[str, str | None] = {}
    if max_sessions is not None:
        environ[MAX_SESSIONS_VAR] = str(max_sessions)
    if session_timeout is not None:
        environ[SESSION_TIMEOUT_VAR] = str(session_timeout)
    # The environment stays applied while serving, so worker processes inherit it.
    with imported_app(folder, environ) as app:
        if not callable(app):  # uvicorn would say so in a traceback, after "serving ..."
            raise AppLoadError(
                f"server/app.py's `app` is a {type(app).__name__}, not an ASGI app; "
                f"make it with openenv.create_app(...)"
            )
        name, sessions = _check_applied(app, max_sessions, session_timeout)
        default_protocols()  # a bad OPENENV_HEADER_TIMEOUT is refused before "serving ..."
        sock = _listen(host, port)
        with sock:
            url = f"http://{_url_host(host)}:{sock.getsockname()[1]}"
            if on_ready is not None:
                on_ready(ServeInfo(name, Path(path), url, workers, sessions))
            # openenv's runner: heartbeats, frame limits, and on SIGTERM/SIGINT a
            # drain (close 1001 to every session, every environment closed), exit 0.
            options: dict[str, Any] = {"log_level": "info"}
            if reload:
                options.update(reload=True, reload_dirs=[str(folder)])
            try:
                run_on_socket(
                    # Workers and the reloader import the app in their own processes.
                    f"{APP_MODULE}:app" if workers > 1 or reload else app,
                    sock,
                    workers=workers,
                    app_dir=folder,
                    shutdown_timeout=_shutdown_timeout(app),
                    **options,
                )
            except SystemExit as exc:  # uvicorn's way out when the app's startup fails
                message = f"the app failed to start (exit code {exc.code}); see the log above"
                raise RuntimeError(message) from None


def _check_applied(
    app: Any, max_sessions: int | None, session_timeout: float | None
) -> tuple[str, int | None]:
    """Refuse to serve an app that would silently ignore --max-sessions or --session-timeout."""
    service = getattr(getattr(app, "state", None), "openenv", None)
    if service is None:
        if max_sessions is not None or session_timeout is not None:
            raise AppLoadError(
                "server/app.py's `app` was not made by openenv.create_app, so "
                "--max-sessions and --session-timeout cannot apply to it"
            )
        return "the app", None
    cap = service.registry.max_sessions
    if max_sessions is not None and cap != max_sessions:
        raise AppLoadError(
            f"server/app.py ignores {MAX_SESSIONS_VAR}: asked for {max_sessions} sessions, "
            f"its app holds {cap}. Build its config with ConcurrencyConfig.from_env(...)"
        )
    timeout = service.concurrency.session_timeout
    if session_timeout is not None and timeout != session_timeout:
        raise AppLoadError(
            f"server/app.py ignores {SESSION_TIMEOUT_VAR}: asked for {session_timeout}s, "
            f"its app uses {timeout}. Build its config with ConcurrencyConfig.from_env(...)"
        )
    return str(service.metadata.name), int(cap)


def _shutdown_timeout(app: Any) -> float | None:
    """The longest ``shutdown_timeout`` of the app's environments (``None``: not openenv's)."""
    state = getattr(app, "state", None)
    services = [getattr(state, "openenv", None), *getattr(state, "openenv_envs", {}).values()]
    timeouts = [float(s.settings.shutdown_timeout) for s in services if s is not None]
    return max(timeouts, default=None)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listen now: connections queue until the workers are up instead of being refused.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve_command(
    path: Annotated[
        Path, typer.Argument(help="The environment folder, holding server/app.py.")
    ] = Path("."),
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0: all).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port; 0 picks a free one.")] = 8000,
    workers: Annotated[
        int,
        typer.Option(
            min=1, help="Server processes, sharing the session cap; any that dies is replaced."
        ),
    ] = 1,
    max_sessions: Annotated[
        int | None,
        typer.Option(
            min=1, help="Session cap of the whole server, all workers (default: the app's own)."
        ),
    ] = None,
    session_timeout: Annotated[
        float | None, typer.Option(min=0.001, help="Close sessions idle this many seconds.")
    ] = None,
    reload: Annotated[
        bool, typer.Option("--reload", help="Restart when a file in PATH changes.")
    ] = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray", help="Serve replicas on a Ray cluster ($RAY_ADDRESS, else a local one)."
        ),
    ] = False,
    replicas: Annotated[int, typer.Option(min=1, help="--ray: replicas to start with.")] = 1,
    min_replicas: Annotated[
        int | None, typer.Option(min=1, help="--ray: fewest replicas (default: --replicas).")
    ] = None,
    max_replicas: Annotated[
        int | None, typer.Option(min=1, help="--ray: most replicas (default: --replicas).")
    ] = None,
    num_cpus: Annotated[
        float, typer.Option(min=0.0, help="--ray: CPUs Ray reserves for each replica.")
    ] = 1.0,
    start_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="--ray: seconds a replica may go without serving before it is replaced "
            "(a start given up doubles the next one's, up to 8 times this).",
        ),
    ] = 300.0,
) -> None:
    """Serve the environment in PATH (default: this folder) over WebSocket sessions."""
    # An option the chosen way of serving would drop is refused, not ignored.
    fleet_only = {
        "--replicas": replicas != 1,
        "--min-replicas": min_replicas is not None,
        "--max-replicas": max_replicas is not None,
        "--num-cpus": num_cpus != 1.0,
        "--start-timeout": start_timeout != 300.0,
    }
    one_machine = {
        "--workers": workers != 1,
        "--reload": reload,
        "--session-timeout": session_timeout is not None,
    }
    dropped = [f for f, given in (one_machine if ray else fleet_only).items() if given]
    if dropped:
        why = (
            "does not apply to --ray: each replica is one process with its app's own "
            "settings; leave it out"
            if ray
            else "is an option of --ray (a fleet of replicas); add --ray or leave it out"
        )
        typer.echo(f"error: {dropped[0]} {why}", err=True)
        raise typer.Exit(1)
    if ray:
        from openenv.cli.serve_fleet import serve_fleet

        try:
            serve_fleet(
                path,
                host=host,
                port=port,
                replicas=replicas,
                min_replicas=min_replicas,
                max_replicas=max_replicas,
                max_sessions=max_sessions,
                num_cpus=num_cpus,
                start_timeout=start_timeout,
            )
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        return

    def ready(info: ServeInfo) -> None:
        typer.echo(f"{info.describe()}; play it at {info.url}/web; Ctrl+C to stop")

    try:
        serve(
            path,
            host=host,
            port=port,
            workers=workers,
            max_sessions=max_sessions,
            session_timeout=session_timeout,
            reload=reload,
            on_ready=ready,
        )
    except (ValueError, OSError, RuntimeError, AppLoadError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
