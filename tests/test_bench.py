"""`openenv bench` and `run_bench` against real servers on loopback."""

from __future__ import annotations

import functools
import importlib

import orjson
import pytest
from servers import Ping, PingEnvironment, Pong, Tracker
from typer.testing import CliRunner

from openenv import ConcurrencyConfig, ConnectionFailedError, create_app
from openenv.adapters.gymnasium import create_gymnasium_app
from openenv.bench import run_bench
from openenv.cli import app as cli
from openenv.testing import run_server


@pytest.mark.parametrize("client", ["picows", "websockets"])
def test_every_session_takes_its_steps_and_the_server_saw_them(client: str) -> None:
    tracker = Tracker()
    app = create_app(
        functools.partial(PingEnvironment, tracker),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=8),
    )
    with run_server(app) as url:
        report = run_bench(url, sessions=8, steps=20, action={"message": "x"}, client=client)
    assert (report.steps, report.sessions_ok, dict(report.errors)) == (160, 8, {})
    assert len(report.latencies) == 160
    assert len(report.connect_times) == 8
    assert report.latency(50) <= report.latency(99) <= report.latency(100)
    tracker.wait_closed(8)  # the load generator closed every session it opened


@pytest.mark.parametrize("client", ["picows", "websockets"])
def test_sessions_spread_over_several_servers_by_their_room(client: str) -> None:
    trackers = [Tracker(), Tracker()]
    apps = [
        create_app(
            functools.partial(PingEnvironment, tracker),
            Ping,
            Pong,
            ConcurrencyConfig(max_concurrent_envs=cap),
        )
        for tracker, cap in zip(trackers, (3, 5), strict=True)
    ]
    with run_server(apps[0]) as first, run_server(apps[1]) as second:
        urls = f"{first},{second}"
        report = run_bench(urls, sessions=8, steps=10, action={"message": "x"}, client=client)
    assert (report.steps, report.sessions_ok, dict(report.errors)) == (80, 8, {})
    # Each server held exactly as many sessions as it has room for, and closed them.
    assert [len(t.created) for t in trackers] == [3, 5]
    assert [len(t.closed) for t in trackers] == [3, 5]


def test_a_server_of_several_that_is_down_is_passed_over() -> None:
    tracker = Tracker()
    app = create_app(
        functools.partial(PingEnvironment, tracker),
        Ping,
        Pong,
        ConcurrencyConfig(max_concurrent_envs=4),
    )
    with run_server(app) as url:
        report = run_bench(f"{url},http://127.0.0.1:9", sessions=4, steps=5, action={})
    assert (report.steps, report.sessions_ok, dict(report.errors)) == (20, 4, {})
    assert len(tracker.created) == 4


def test_errors_are_counted_by_code_and_refused_sessions_fail() -> None:
    app = create_app(PingEnvironment, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=2))
    with run_server(app) as url:
        report = run_bench(url, sessions=3, steps=5, action={"message": 42})
    assert report.sessions_ok == 0
    # 2 admitted sessions x 5 steps; the refusal once (its error frame and its
    # close 1013 are one event).
    assert dict(report.errors) == {"VALIDATION_ERROR": 10, "CAPACITY_REACHED": 1}
    assert "valid string" in report.error_samples["VALIDATION_ERROR"]


@pytest.mark.parametrize("client", ["picows", "websockets"])
def test_sessions_ready_and_waiting_for_the_others_are_not_reply_timeouts(client: str) -> None:
    # The third session waits in the server's line far longer than the reply
    # timeout; the two admitted ones wait at the start gate, with no reply due.
    config = ConcurrencyConfig(max_concurrent_envs=2, queue_timeout=60)
    app = create_app(PingEnvironment, Ping, Pong, config)
    with run_server(app) as url:
        report = run_bench(
            url,
            sessions=3,
            steps=5,
            action={"message": "x"},
            client=client,
            reply_timeout=0.5,
            progress_interval=0.05,
        )
    assert dict(report.errors) == {"TIMEOUT": 1}
    assert (report.steps, report.sessions_ok) == (10, 2)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="either steps or duration"):
        run_bench("http://127.0.0.1:9", steps=1, duration=1.0)
    with pytest.raises(ValueError, match="unknown client"):
        run_bench("http://127.0.0.1:9", steps=1, client="curl")


def test_a_server_that_is_not_there_is_one_error_before_any_load() -> None:
    with pytest.raises(ConnectionFailedError, match=r"cannot connect to http://127.0.0.1:9"):
        run_bench("http://127.0.0.1:9", sessions=2, steps=1, connect_timeout=2)
    result = CliRunner().invoke(cli, ["bench", "http://127.0.0.1:9", "--steps", "1"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot connect to http://127.0.0.1:9")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "app_module",
    [
        "echo_env.server.app",
        "counter_env.server.app",
        "wordle_env.server.app",
        "benchmark_env.server.app",
        "gymnasium_env.server.app",
    ],
)
def test_with_no_action_every_reference_env_is_stepped_with_a_valid_one(app_module: str) -> None:
    app = importlib.import_module(app_module).app
    with run_server(app) as url:
        report = run_bench(url, sessions=4, steps=20)
    assert (report.steps, report.sessions_ok, dict(report.errors)) == (80, 4, {})


def test_episodes_that_end_are_reset_and_stepping_goes_on() -> None:
    # CartPole falls within a few dozen steps of one action repeated.
    tracker_app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(tracker_app) as url:
        report = run_bench(url, sessions=2, steps=300, client="websockets")
        picows = run_bench(url, sessions=2, steps=300, client="picows")
    for run in (report, picows):
        assert (run.steps, run.sessions_ok, dict(run.errors)) == (600, 2, {})


def test_more_sessions_than_the_server_holds_is_warned_before_the_run() -> None:
    app = create_app(PingEnvironment, Ping, Pong, ConcurrencyConfig(max_concurrent_envs=2))
    notices: list[str] = []
    with run_server(app) as url:
        run_bench(url, sessions=3, steps=1, action={"message": "x"}, notice=notices.append)
    assert notices == [
        "--sessions 3 is more than the server's 2 session slots: 1 will be refused "
        "(or wait in line, if the server queues)"
    ]


def test_cli_prints_json_and_exits_1_when_sessions_fail(echo_url: str) -> None:
    runner = CliRunner()
    ok = runner.invoke(
        cli,
        [
            "bench",
            echo_url,
            "-c",
            "4",
            "--duration",
            "0.3",
            "--action",
            '{"message": "hi"}',
            "--json",
        ],
    )
    assert ok.exit_code == 0, ok.output
    report = orjson.loads(ok.stdout)
    assert report["sessions_ok"] == 4
    assert report["steps"] > 0
    assert report["errors"] == {}
    bad = runner.invoke(cli, ["bench", echo_url, "-c", "2", "--steps", "2", "--action", "{}"])
    assert bad.exit_code == 1
    assert "VALIDATION_ERROR" in bad.stdout
    both = runner.invoke(cli, ["bench", echo_url, "--steps", "1", "--duration", "1"])
    assert both.exit_code == 2
    not_json = runner.invoke(cli, ["bench", echo_url, "--action", "{nope"])
    assert not_json.exit_code == 2
