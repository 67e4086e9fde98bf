"""The ``websockets`` driver: one coroutine per session, for when picows is not installed.

It costs several times more CPU per step than the picows driver, so against a
fast server it saturates its own core first; the report's ``client_cpu``
shows when that happens.
"""

from __future__ import annotations

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from openenv.bench._run import Run, SessionStats, now

__all__ = ["run_session"]


async def run_session(run: Run, url: str, stats: SessionStats, connect_timeout: float) -> None:
    """Connect, reset, wait for every session to be ready, then step until told to stop."""
    ws: ClientConnection | None = None
    try:
        started = now()
        try:
            ws = await connect(
                url,
                open_timeout=connect_timeout,
                ping_interval=None,
                compression=None,
                max_size=None,
                additional_headers=run.headers,
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            stats.errored = True
            run.error("CONNECT_FAILED", f"{type(exc).__name__}: {exc}")
            return
        run.connected(now() - started)
        stats.abort = ws.transport.abort
        try:
            stats.sent = now()
            await ws.send(run.reset_frame.decode())
            if not run.reset_reply(stats, await ws.recv()):
                stats.errored = True
                await ws.close()
                return
        except ConnectionClosed as exc:
            _closed(run, stats, exc)
            return
    finally:
        run.session_ready()
    await run.go.wait()
    frame: bytes | None = run.step_frame
    try:
        while frame is not None:
            stats.sent = now()
            await ws.send(frame.decode())
            frame = run.step_reply(stats, await ws.recv(), now())
        await ws.close()
    except ConnectionClosed as exc:
        _closed(run, stats, exc)


def _closed(run: Run, stats: SessionStats, exc: ConnectionClosed) -> None:
    if stats.finished or stats.errored:  # a refusal's close: its error frame counted it
        return
    stats.errored = True
    if exc.rcvd is None:
        run.error("DISCONNECTED", "the connection dropped")
    else:
        run.error(f"CLOSED_{exc.rcvd.code}", exc.rcvd.reason)
