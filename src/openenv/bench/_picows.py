"""The ``picows`` driver: callbacks straight from the frame parser, no task per step.

Each reply is handled inside ``on_ws_frame``, which sends the next step at
once; no coroutine, future or timer is made per step. This keeps the load
generator several times cheaper per step than a ``websockets`` client.
"""

from __future__ import annotations

import asyncio
import typing

from picows import WSCloseCode, WSError, WSFrame, WSListener, WSMsgType, WSTransport, ws_connect

from openenv.bench._run import Run, SessionStats, now

__all__ = ["run_session"]

_TEXT = WSMsgType.TEXT
_DATA = (WSMsgType.TEXT, WSMsgType.BINARY)


class _Session(WSListener):
    def __init__(self, run: Run, stats: SessionStats) -> None:
        loop = asyncio.get_running_loop()
        self.run = run
        self.stats = stats
        self.transport: WSTransport | None = None
        self.reset_done: asyncio.Future[bool] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.stepping = False

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        kind = frame.msg_type
        if kind in _DATA:
            payload = frame.get_payload_as_bytes()
            if self.stepping:
                stats = self.stats
                frame_out = self.run.step_reply(stats, payload, now())
                if frame_out is not None:
                    stats.sent = now()
                    transport.send(_TEXT, frame_out)
                else:
                    self.stepping = False
                    transport.send_close(WSCloseCode.OK)
            elif not self.reset_done.done():
                ok = self.run.reset_reply(self.stats, payload)
                self.stats.errored = not ok  # now: a refusal's close frame may follow at once
                self.reset_done.set_result(ok)
        elif kind is WSMsgType.CLOSE:
            # A refusal already counted its error frame: the close is the same event.
            if not self.stats.finished and not self.stats.errored:
                self.stats.errored = True
                self.run.error(f"CLOSED_{frame.get_close_code().value}", frame.get_close_reason())
            if not transport.is_close_frame_sent:
                transport.send_close(frame.get_close_code())
            transport.disconnect()

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        if not self.stats.finished and not self.stats.errored:
            self.stats.errored = True
            self.run.error("DISCONNECTED", "the connection dropped")
        if not self.reset_done.done():
            self.reset_done.set_result(False)
        if not self.done.done():
            self.done.set_result(None)

    def send_step(self) -> None:
        assert self.transport is not None
        self.stepping = True
        self.stats.sent = now()
        self.transport.send(_TEXT, self.run.step_frame)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.disconnect(graceful=False)


async def run_session(run: Run, url: str, stats: SessionStats, connect_timeout: float) -> None:
    """Connect, reset, wait for every session to be ready, then step until told to stop."""
    session: _Session | None = None
    try:
        started = now()
        try:
            transport, listener = await ws_connect(
                lambda: _Session(run, stats),
                url,
                websocket_handshake_timeout=connect_timeout,
                enable_auto_pong=True,
                extra_headers=run.headers,
                # aiofastnet (picows' default when installed) connects in Python,
                # some 200 us of this core per connection: opening 512 at once, the
                # server would idle for the first 100 ms. uvloop connects in C.
                use_aiofastnet=False,
            )
        except (OSError, TimeoutError, WSError) as exc:
            stats.errored = True
            run.error("CONNECT_FAILED", f"{type(exc).__name__}: {exc}")
            return
        run.connected(now() - started)
        session = typing.cast(_Session, listener)
        session.transport = transport
        stats.abort = session.abort
        stats.sent = now()
        transport.send(_TEXT, run.reset_frame)
        if not await session.reset_done:
            stats.errored = True
            transport.disconnect()
            return
    finally:
        run.session_ready()
    await run.go.wait()
    assert session is not None
    if session.done.done():
        return
    session.send_step()
    await session.done
