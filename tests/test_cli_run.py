"""``openenv run`` and ``openenv demo``, both on top of ``Runners``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, create_app
from openenv.cli import app
from openenv.cli.demo import drive
from openenv.cli.run import load_agent
from openenv.testing import run_server

runner = CliRunner()
OPENENV = str(Path(sys.executable).with_name("openenv"))


def test_run_plays_random_episodes_and_writes_json_lines(echo_url: str, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    outcome = runner.invoke(
        app, ["run", "--env", echo_url, "--tasks", "5", "--max-steps", "3", "--out", str(out)]
    )
    assert outcome.exit_code == 0, outcome.output
    assert "5 (5 ok, 0 error, 0 timeout)" in outcome.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == [f"task-{i}" for i in range(5)]
    assert all(r["status"] == "ok" and r["steps"] == 3 for r in rows)
    assert all(set(r["value"]) >= {"echoed_message", "done"} for r in rows)


def test_run_with_an_agent_that_fails_exits_non_zero(echo_url: str) -> None:
    outcome = runner.invoke(
        app, ["run", "--env", echo_url, "--agent", "runtime_agents:failing_agent", "--tasks", "2"]
    )
    assert outcome.exit_code == 1
    assert "2 (0 ok, 2 error, 0 timeout)" in outcome.output
    assert "ValueError: 2" in outcome.output
    assert "ValueError: agent of task-0 gave up" in outcome.output  # the first message


def test_run_spreads_episodes_over_several_servers(tmp_path: Path) -> None:
    def echo(cap: int) -> Any:
        config = ConcurrencyConfig(max_concurrent_envs=cap)
        return run_server(create_app(EchoEnvironment, EchoAction, EchoObservation, config))

    with echo(2) as first, echo(3) as second:
        outcome = runner.invoke(
            app,
            [
                *("run", "--env", first, "--env", second, "--tasks", "40"),
                *("--max-steps", "2", "--concurrency", "16"),
            ],
        )
    assert outcome.exit_code == 0, outcome.output
    assert "40 (40 ok, 0 error, 0 timeout)" in outcome.output


def test_run_names_a_wrong_path_as_such() -> None:
    with run_server(
        create_app(EchoEnvironment, EchoAction, EchoObservation, ConcurrencyConfig())
    ) as url:
        outcome = runner.invoke(app, ["run", "--env", f"{url}/wss", "--tasks", "1"])
    assert outcome.exit_code == 1
    assert "ConnectionFailedError: 1" in outcome.output
    assert "is this the server's root URL?" in outcome.output


def test_run_on_worker_processes_with_an_act_agent_class(echo_url: str) -> None:
    outcome = runner.invoke(
        app,
        [
            *("run", "--env", echo_url, "--agent", "runtime_agents:Shouter", "--tasks", "4"),
            *("--workers", "2", "--max-steps", "2"),
        ],
    )
    assert outcome.exit_code == 0, outcome.output
    assert "4 (4 ok" in outcome.output


def test_run_explains_a_bad_agent(echo_url: str) -> None:
    for spec, message in [
        ("runtime_agents", "module:attribute"),
        ("no_such_module_xyz:agent", "cannot import module 'no_such_module_xyz'"),
        ("runtime_agents:nope", "has no attribute 'nope'"),
    ]:
        outcome = runner.invoke(app, ["run", "--env", echo_url, "--agent", spec])
        assert outcome.exit_code == 2
        assert message in outcome.output


def test_run_refuses_a_bad_url() -> None:
    outcome = runner.invoke(app, ["run", "--env", "localhost:8000"])
    assert outcome.exit_code == 2
    assert "isn't a valid environment URL" in outcome.output


def test_load_agent_reports_errors_inside_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The module exists but imports something missing: that is the error shown, not "not found".
    (tmp_path / "broken_agent_mod.py").write_text("import not_installed_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="not_installed_dependency_xyz"):
        load_agent("broken_agent_mod:play")


async def test_demo_drives_episodes_through_runners(echo_url: str) -> None:
    report = await drive(echo_url, sessions=8, steps=5, progress=False)
    assert (report.sessions, report.failed_sessions, report.steps) == (8, 0, 40)
    assert len(report.latencies) == 40
    assert report.percentile(50) <= report.percentile(99)


async def test_demo_drives_any_environment_with_actions_from_its_schema() -> None:
    # CartPole's episodes end within 60 random steps. The demo once sent echo's
    # {"message": ...} to every app (a scaffolded env's sessions all failed with
    # EnvValidationError) and stepped on past an episode's end (EnvExecutionError).
    from openenv.adapters.gymnasium import create_gymnasium_app

    app = create_gymnasium_app("CartPole-v1", ConcurrencyConfig(max_concurrent_envs=4))
    with run_server(app) as url:
        report = await drive(url, sessions=2, steps=60, progress=False)
    assert (report.failed_sessions, dict(report.errors), report.steps) == (0, {}, 120)


def test_a_run_killed_midway_resumes_without_replaying_what_it_kept(
    echo_url: str, tmp_path: Path
) -> None:
    out, journal = tmp_path / "results.jsonl", tmp_path / "journal"
    command = [
        *(OPENENV, "run", "--env", echo_url, "--agent", "runtime_agents:held_echo"),
        *("--tasks", "10", "--concurrency", "3", "--out", str(out), "--no-progress"),
    ]
    env = {**os.environ, "OPENENV_TEST_JOURNAL": str(journal)}
    tests = Path(__file__).parent
    first = subprocess.Popen(command, cwd=tests, env={**env, "OPENENV_TEST_HOLD": "5"})
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_bytes().count(b"\n") == 5):
            assert first.poll() is None, "the run ended on its own"
            assert time.monotonic() < deadline, "five results written within 60 s"
            time.sleep(0.02)
    finally:
        first.kill()  # SIGKILL: no chance to tidy up
        first.wait()
    kept = [json.loads(line)["task_id"] for line in out.read_text().splitlines()]
    assert sorted(kept) == [f"task-{i}" for i in range(5)]

    second = subprocess.run([*command, "--resume"], cwd=tests, env=env, capture_output=True)
    assert second.returncode == 0, second.stdout.decode() + second.stderr.decode()
    assert "resuming: 5 of 10 tasks done" in second.stdout.decode()
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in results] == [f"task-{i}" for i in range(10)]
    assert [r["value"] for r in results] == [f"task-{i}" for i in range(10)]
    lines = [line.split() for line in journal.read_text().splitlines()]
    starts = Counter(task_id for word, task_id, _ in lines if word == "start")
    done = Counter(task_id for word, task_id, _ in lines if word == "done")
    assert done == {f"task-{i}": 1 for i in range(10)}  # none played to the end twice
    assert all(starts[f"task-{i}"] == 1 for i in range(5))  # what was kept was not replayed


def test_run_records_every_episode_when_asked(echo_url: str, tmp_path: Path) -> None:
    from openenv.trajectories import load

    folder = tmp_path / "rec"
    outcome = runner.invoke(
        app,
        [*("run", "--env", echo_url, "--tasks", "3", "--max-steps", "2"), "--record", str(folder)],
    )
    assert outcome.exit_code == 0, outcome.output
    episodes = load(folder)
    assert sorted(e.session for e in episodes) == ["task-0", "task-1", "task-2"]
    assert all([s.kind for s in e.steps] == ["reset", "step", "step"] for e in episodes)


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real ``openenv run`` in a process of its own, in ``cwd``."""
    return subprocess.run(
        [OPENENV, "run", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("import not_installed_dependency_xyz\n", "ModuleNotFoundError: No module named"),
        ("def play(:\n", "SyntaxError: invalid syntax"),
        ("\nraise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
        ("import sys; sys.exit(0)\n", "SystemExit: 0"),
        ("\nimport sys; sys.exit('usage: my_agent URL')\n", "SystemExit: usage: my_agent URL"),
    ],
)
def test_an_agent_module_that_fails_to_import_is_one_line(
    echo_url: str, tmp_path: Path, source: str, line: str
) -> None:
    (tmp_path / "my_agent.py").write_text(source)
    result = run_cli("--env", echo_url, "--agent", "my_agent:play", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    where = "2" if source.startswith("\n") else "1"
    assert result.stderr.startswith(f"error: --agent my_agent:play: my_agent.py:{where}: {line}")
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_an_out_file_that_cannot_be_written_is_refused_before_playing(
    echo_url: str, tmp_path: Path
) -> None:
    (tmp_path / "results").mkdir()
    for out, why in [
        ("results", "Is a directory"),
        ("nowhere/r.jsonl", "No such file or directory"),
    ]:
        result = run_cli("--env", echo_url, "--tasks", "2", "--out", out, cwd=tmp_path)
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr == f"error: cannot write --out {out}: {why}\n"


def test_resuming_from_a_file_that_is_not_results_names_file_and_line(
    echo_url: str, tmp_path: Path
) -> None:
    (tmp_path / "notes.jsonl").write_text('{"task_id": "task-0"}\n{"note": 1}\n')
    args = ("--env", echo_url, "--tasks", "2", "--out", "notes.jsonl", "--resume")
    result = run_cli(*args, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(
        "error: cannot resume from --out notes.jsonl: line 1 is not a result of openenv run ("
    )
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert (tmp_path / "notes.jsonl").read_text() == '{"task_id": "task-0"}\n{"note": 1}\n'


def test_resume_drops_a_half_written_last_line_and_plays_its_task(
    echo_url: str, tmp_path: Path
) -> None:
    """runners.md: "a half-written last line is dropped"; the file ends in task order."""
    out = tmp_path / "results.jsonl"
    command = ["run", "--env", echo_url, "--tasks", "3", "--max-steps", "1", "--out", str(out)]
    assert runner.invoke(app, command).exit_code == 0
    first, second, _ = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(second + first[: len(first) // 2])  # as a kill mid-write leaves it
    outcome = runner.invoke(app, [*command, "--resume"])
    assert outcome.exit_code == 0, outcome.output
    assert "resuming: 1 of 3 tasks done" in outcome.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task_id"], r["status"]) for r in rows] == [(f"task-{i}", "ok") for i in range(3)]


def test_out_keeps_results_whose_values_are_not_plain_json(echo_url: str, tmp_path: Path) -> None:
    """An int-keyed dict, NumPy numbers, a huge int: written, not the run ended with exit 2."""
    out = tmp_path / "results.jsonl"
    command = ["run", "--env", echo_url, "--agent", "runtime_agents:odd_value_agent"]
    outcome = runner.invoke(app, [*command, "--tasks", "2", "--out", str(out)])
    assert outcome.exit_code == 0, outcome.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["value"] for r in rows] == [
        {"1": "one", "score": 0.5, "logits": [0, 1, 2]},
        str(2**70),
    ]


def test_out_writes_a_values_nan_and_infinities_as_frames_and_rewards_do(
    echo_url: str, tmp_path: Path
) -> None:
    """As null they read back as no value at all; the reward was "NaN" already."""
    out = tmp_path / "results.jsonl"
    command = ["run", "--env", echo_url, "--agent", "runtime_agents:non_finite_value_agent"]
    outcome = runner.invoke(app, [*command, "--tasks", "1", "--out", str(out)])
    assert outcome.exit_code == 0, outcome.output
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["value"] == {
        "loss": "NaN",
        "bounds": ["-Infinity", 1.5],
        "scores": [0.5, "Infinity"],
        "best": "NaN",
        "counts": [0, 1],
        "name": "NaN",
    }
    outcome = runner.invoke(app, [*command, "--tasks", "1", "--out", str(out), "--resume"])
    assert outcome.exit_code == 0, outcome.output  # read back by --resume, as it was
    assert "resuming: 1 of 1 tasks done" in outcome.output
    assert [json.loads(line) for line in out.read_text().splitlines()] == [row]


def test_resume_with_fewer_tasks_keeps_the_results_of_the_others(
    echo_url: str, tmp_path: Path
) -> None:
    """--resume "keeps the results already in --out": none is dropped when the file is redone."""
    out = tmp_path / "results.jsonl"
    command = ["run", "--env", echo_url, "--max-steps", "1", "--out", str(out)]
    assert runner.invoke(app, [*command, "--tasks", "4"]).exit_code == 0
    before = out.read_text().splitlines()
    outcome = runner.invoke(app, [*command, "--tasks", "2", "--resume"])
    assert outcome.exit_code == 0, outcome.output
    assert "2 (2 ok, 0 error, 0 timeout)" in outcome.output  # the summary is of this run's tasks
    assert out.read_text().splitlines() == before


def test_random_episodes_end_in_an_environment_only_a_tool_ends(tmp_path: Path) -> None:
    # counter_env's plain steps never end an episode (its submit tool does): a run
    # of the default RandomAgent with no --max-steps played its episodes for ever.
    from counter_env.server.app import app as counter_app

    out = tmp_path / "results.jsonl"
    with run_server(counter_app) as url:
        outcome = runner.invoke(
            app, ["run", "--env", url, "--tasks", "2", "--timeout", "30", "--out", str(out)]
        )
    assert outcome.exit_code == 0, outcome.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["status"], r["steps"]) for r in rows] == [("ok", 1000), ("ok", 1000)]
