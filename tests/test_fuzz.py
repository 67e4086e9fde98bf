"""Property-based fuzzing of frame handling against a real server.

Whatever arrives, the server answers with a well-formed frame or closes with a
documented code, never crashes, and frees every slot afterwards.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import Ping, PingEnvironment, Pong
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close
from websockets.sync.client import ClientConnection, connect

from openenv import ConcurrencyConfig, create_app, protocol
from openenv.client import ws_url
from openenv.testing import run_server

EXAMPLES = int(os.environ.get("OPENENV_FUZZ_EXAMPLES", "1500"))
DOCUMENTED_CLOSE_CODES = {1000, 1008, 1009, 1011}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
types = st.sampled_from(["reset", "step", "state", "close", "jump", "", "STEP"]) | st.text(
    max_size=6
)
looks_valid = st.fixed_dictionaries(
    {"type": types},
    optional={
        "data": json_values
        | st.fixed_dictionaries(
            {},
            optional={
                "message": json_values,
                "fail": json_values,
                "seed": json_values,
                "episode_id": json_values,
            },
        ),
        "id": json_values,
    },
)
frames = (
    st.binary(max_size=64)
    | st.text(max_size=64)
    | json_values.map(json.dumps)
    | looks_valid.map(json.dumps)
)


class Prober:
    """One connection at a time; reconnects whenever the server closes one."""

    def __init__(self, url: str) -> None:
        self.url = ws_url(url)
        self.ws: ClientConnection | None = None
        self.sent = 0
        self.reconnects = 0

    def send(self, frame: str | bytes) -> None:
        if self.ws is None:
            # Alternate as openenv's clients connect (no compression: the fast
            # framing and direct steps) and as a browser may (permessage-deflate).
            compression = None if self.reconnects % 2 else "deflate"
            self.ws = connect(self.url, open_timeout=10, compression=compression).__enter__()
            self.reconnects += 1
        self.sent += 1
        reply, close = self._exchange(frame)
        if close is not None:
            assert close.code in DOCUMENTED_CLOSE_CODES, close
            self.close()
            return
        assert reply is not None, "connection dropped without a close frame"
        message = protocol.parse_server_message(reply)  # raises if malformed
        if isinstance(message, protocol.ErrorReply):
            assert message.data.code in protocol.ErrorCode
            assert "Traceback" not in message.data.message

    def _exchange(self, frame: str | bytes) -> tuple[str | bytes | None, Close | None]:
        assert self.ws is not None
        try:
            self.ws.send(frame)
            return self.ws.recv(timeout=10), None
        except ConnectionClosed as closed:
            return None, closed.rcvd

    def close(self) -> None:
        if self.ws is not None:
            self.ws.__exit__(None, None, None)
            self.ws = None


@pytest.fixture(scope="module")
def prober() -> Iterator[tuple[str, Prober]]:
    app = create_app(PingEnvironment, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        probe = Prober(url)
        yield url, probe
        probe.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frame=frames)
def test_any_frame_gets_a_well_formed_answer(
    prober: tuple[str, Prober], frame: str | bytes
) -> None:
    prober[1].send(frame)


def test_after_fuzzing_every_slot_is_free(prober: tuple[str, Prober]) -> None:
    url, probe = prober
    probe.close()
    assert probe.sent >= EXAMPLES
    assert probe.reconnects > 1  # some frames did end sessions (close, garbage runs)
    deadline = time.monotonic() + 10
    while (health := httpx.get(f"{url}/health").json())["active_sessions"] != 0:
        assert time.monotonic() < deadline, f"slots still taken: {health}"
        time.sleep(0.01)
    assert health["status"] == "healthy"
    if report := os.environ.get("OPENENV_FUZZ_REPORT"):  # written for benchmarks/fuzz_volume.py
        summary = {"frames": probe.sent, "sessions": probe.reconnects, "leaked_slots": 0}
        Path(report).write_text(json.dumps(summary))
