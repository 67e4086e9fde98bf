"""OpenReward's ``/call`` streams that break are resumed by ``task_id``, however many
calls of the session were started since: a call is forgotten only once it is done."""

from __future__ import annotations

import json
import threading
from typing import ClassVar

import httpx

from counter_env.models import CounterAction, CounterObservation
from counter_env.server.environment import CounterEnvironment
from openenv import ConcurrencyConfig, create_app, tool
from openenv.testing import run_server


class Gated(CounterEnvironment):
    """The counter, plus a tool that waits (on a thread) until the test opens the gate."""

    gate: ClassVar[threading.Event] = threading.Event()
    runs: ClassVar[list[str]] = []

    @tool
    def wait(self) -> str:
        """Wait for the gate."""
        assert Gated.gate.wait(60)
        Gated.runs.append("wait")
        return "through"


def start_call(http: httpx.Client, headers: dict[str, str], name: str, **args: int) -> str:
    """Start a call, read its ``task_id`` and drop the stream, as a broken network would."""
    body = {"name": name, "input": args}
    with http.stream("POST", "/call", json=body, headers=headers) as stream:
        lines = stream.iter_lines()
        assert next(lines) == "event: task_id"
        return next(lines).removeprefix("data: ")


def test_a_call_broken_while_later_calls_queue_behind_it_is_resumed() -> None:
    Gated.gate.clear()
    Gated.runs.clear()
    app = create_app(
        Gated, CounterAction, CounterObservation, ConcurrencyConfig(max_concurrent_envs=2)
    )
    with run_server(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        opened = http.post("/create_session").text
        headers = {"X-Session-ID": opened.split("data: ", 1)[1].split()[0]}
        assert http.post("/create", json={"split": "train", "index": 0}, headers=headers).is_success
        try:
            first = start_call(http, headers, "wait")
            # An agent's parallel tool calls: they wait their turn behind the first.
            later = [start_call(http, headers, "increment", amount=1) for _ in range(6)]
        finally:
            Gated.gate.set()
        resumed = http.post(
            "/call", json={"name": "wait", "input": {}, "task_id": first}, headers=headers
        )
        assert "event: end" in resumed.text, resumed.text
        end = resumed.text.split("event: end\r\ndata: ", 1)[1].strip()
        assert json.loads(end)["output"]["blocks"][0]["text"] == "through"
        last = http.post(
            "/call", json={"name": "increment", "input": {}, "task_id": later[-1]}, headers=headers
        )
        assert '{\\"value\\":6}' in last.text, last.text
        assert Gated.runs == ["wait"]  # resumed, not run again
        assert http.post("/delete", headers=headers).is_success
