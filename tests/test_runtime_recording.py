"""Runner-side recording: every episode Runners plays, on disk as it ends, read back and replayed.

The runtime writes the server's recording format, so the same
``openenv.trajectories`` functions read it, and a replay against a real
server checks that what the runtime recorded is exactly what the server says.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import warnings
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner
from websockets.asyncio.server import ServerConnection, serve

from counter_env.models import CounterAction, CounterObservation, CounterTask
from counter_env.server.environment import CounterEnvironment
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import ConcurrencyConfig, EnvValidationError, create_app
from openenv.cli import app as cli
from openenv.runtime import EpisodeSession, ParallelizableAgent, RunConfig, Runners, Task
from openenv.testing import run_server
from openenv.trajectories import load, replay_all, to_parquet, to_rows
from wordle_env import WordleAction, WordleTask
from wordle_env.models import WordleObservation
from wordle_env.server.environment import WordleEnvironment

GAMES = {"w0": ("test-0000", ["xyzzy", "abbot", "abbey"]), "w1": ("test-0001", ["crane"])}


async def guesser(session: EpisodeSession) -> float:
    """Plays the guesses in its input; the game's reward."""
    await session.reset()
    for guess in session.input:
        result = await session.step(WordleAction(guess=guess))
    return float(result.reward or 0.0)


def wordle_tasks(env: Any) -> list[Task]:
    return [
        Task(
            id=name, env=env, agent=guesser, input=guesses, reset_kwargs={"task": WordleTask(id=t)}
        )
        for name, (t, guesses) in GAMES.items()
    ]


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "processes"])
def test_a_recorded_wordle_run_round_trips_and_replays_exactly(
    tmp_path: Path, workers: int
) -> None:
    # In process, the task (a pydantic model) in reset_kwargs is encoded as a
    # server would get it: once a TypeError, now the same as over a socket.
    config = RunConfig(worker_num=workers, record=str(tmp_path / "rec"), progress=False)
    results = Runners.sync_run_task(wordle_tasks(WordleEnvironment), config)
    assert [r.value for r in results] == [1.0, 0.0]

    episodes = sorted(load(tmp_path / "rec"), key=lambda e: e.session)
    assert [e.session for e in episodes] == ["w0", "w1"]
    first, second = episodes
    assert [s.kind for s in first.steps] == ["reset", "step", "step", "step"]
    assert first.steps[0].request["task"]["id"] == "test-0000"
    assert [s.request for s in first.steps[1:]] == [{"guess": g} for g in GAMES["w0"][1]]
    assert [s.reward for s in first.steps[1:]] == [None, 0.0, 1.0]
    assert [s.done for s in first.steps] == [False, False, False, True]
    assert first.steps[3].reply["data"]["metadata"]["reward_parts"]["solved"] == 1.0
    assert all(s.started <= s.ended for s in first.steps)
    assert [s.kind for s in second.steps] == ["reset", "step"]

    rows = to_rows(episodes)
    assert [(r["session"], r["step"], r["kind"]) for r in rows] == [
        ("w0", 0, "reset"),
        ("w0", 1, "step"),
        ("w0", 2, "step"),
        ("w0", 3, "step"),
        ("w1", 0, "reset"),
        ("w1", 1, "step"),
    ]
    assert pq.read_table(to_parquet(episodes, tmp_path / "steps.parquet")).to_pylist() == rows

    app = create_app(WordleEnvironment, WordleAction, WordleObservation)
    with run_server(app) as url:
        assert replay_all(episodes, url) == {"w0/0": [], "w1/0": []}


async def counts_to_target(session: EpisodeSession) -> float:
    observation = (await session.reset()).observation
    names = [tool.name for tool in await session.list_tools()]
    assert {"increment", "submit"} <= set(names)
    await session.call_tool("increment", amount=observation.target - 1)
    await session.call_tool("increment", {"amount": 1})
    output = await session.call_tool("submit")
    return float(output.reward or 0.0)


def test_tool_calls_are_recorded_and_their_reward_counts(tmp_path: Path) -> None:
    app = create_app(
        CounterEnvironment,
        CounterAction,
        CounterObservation,
        ConcurrencyConfig(max_concurrent_envs=8),
    )
    with run_server(app) as url:
        tasks = [
            Task(id=f"c{i}", env=env, agent=counts_to_target, reset_kwargs={"task": task})
            for i, (env, task) in enumerate(
                [
                    (url, CounterTask(id="a", target=4)),
                    (CounterEnvironment, CounterTask(id="b", target=7)),
                ]
            )
        ]
        config = RunConfig(record=str(tmp_path / "rec"), progress=False)
        results = Runners.sync_run_task(tasks, config)
        assert [(r.value, r.reward) for r in results] == [(1.0, 1.0), (1.0, 1.0)]

        episodes = sorted(load(tmp_path / "rec"), key=lambda e: e.session)
        for episode, target in zip(episodes, (4, 7), strict=True):
            kinds = [s.kind for s in episode.steps]
            assert kinds == ["reset", "list_tools", "call_tool", "call_tool", "call_tool"]
            calls = [s.request for s in episode.steps[2:]]
            assert calls == [
                {"name": "increment", "arguments": {"amount": target - 1}},
                {"name": "increment", "arguments": {"amount": 1}},
                {"name": "submit", "arguments": {}},
            ]
            assert episode.steps[-1].reply["data"]["reward"] == 1.0
        rows = to_rows(episodes)
        assert pq.read_table(to_parquet(episodes, tmp_path / "t.parquet")).to_pylist() == rows
        # The in-process episode replays against the server exactly too.
        assert replay_all(episodes, url) == {"c0/0": [], "c1/0": []}


async def makes_a_mistake(session: EpisodeSession) -> str:
    await session.reset()
    with contextlib.suppress(EnvValidationError):
        await session.step({"no_such_field": 1})
    return str((await session.step({"message": "fine"})).observation.echoed_message)


async def hangs_after_reset(session: EpisodeSession) -> None:
    await session.reset()
    await session.state()
    await asyncio.sleep(3600)  # the task's deadline ends it


def test_errors_and_timeouts_are_recorded_with_how_the_episode_ended(tmp_path: Path) -> None:
    tasks = [
        Task(id="mistake", env=EchoEnvironment, agent=makes_a_mistake),
        Task(id="hang", env=EchoEnvironment, agent=hangs_after_reset, timeout=0.5),
    ]
    config = RunConfig(record=str(tmp_path / "rec"), progress=False)
    results = Runners.sync_run_task(tasks, config)
    assert [r.status.value for r in results] == ["ok", "timeout"]

    episodes = {e.session: e for e in load(tmp_path / "rec")}
    mistake = episodes["mistake"]
    assert [s.kind for s in mistake.steps] == ["reset", "step", "step"]
    assert mistake.steps[1].error is not None
    assert mistake.steps[1].error["code"] == "VALIDATION_ERROR"
    assert mistake.steps[2].observation["echoed_message"] == "fine"
    assert [s.kind for s in episodes["hang"].steps] == ["reset", "state"]
    (file,) = (tmp_path / "rec").glob("runner-*.jsonl")
    closed = {
        event["session"]: event["reason"]
        for event in map(orjson.loads, file.read_bytes().splitlines())
        if event["event"] == "closed"
    }
    assert closed == {"mistake": "ok", "hang": "TimeoutError"}
    assert {name: e.ended for name, e in episodes.items()} == closed  # as load() reads it


async def fails_after_reset(session: EpisodeSession) -> str:
    await session.reset()
    raise RuntimeError("the agent's own bug")


def test_a_task_recorded_again_into_the_same_folder_keeps_how_each_episode_ended(
    tmp_path: Path,
) -> None:
    # A task's id is its session's: a second run (a retry of the run, a resume)
    # records the same session again, in a file of its own. The first episode
    # used to read as ended by "reset" (the second run's), its own end lost.
    folder = str(tmp_path / "rec")
    for agent, status in ((fails_after_reset, "error"), (echoes, "ok")):
        config = RunConfig(record=folder, progress=False)
        [result] = Runners.sync_run_task([Task(id="t", env=EchoEnvironment, agent=agent)], config)
        assert result.status.value == status
    first, second = load(folder)
    assert (first.session, first.index, [s.kind for s in first.steps]) == ("t", 0, ["reset"])
    assert (second.session, second.index, [s.kind for s in second.steps]) == (
        "t",
        1,
        ["reset", "step"],
    )
    assert [first.ended, second.ended] == ["RuntimeError", "ok"]


def recorded_sessions(folder: str) -> set[str]:
    return {e.session for e in load(folder)} if Path(folder).is_dir() else set()


async def waits_for_a_recorded_episode(session: EpisodeSession) -> bool:
    """True once the folder in its input holds episode ``w0`` on disk (or False after 60 s)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 60
    while loop.time() < end:
        if "w0" in await asyncio.to_thread(recorded_sessions, session.input):
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "processes"])
def test_episodes_reach_the_disk_while_the_run_goes_on(tmp_path: Path, workers: int) -> None:
    folder = str(tmp_path / "rec")
    tasks = [
        *wordle_tasks(WordleEnvironment)[:1],
        Task(id="watcher", agent=waits_for_a_recorded_episode, input=folder),
    ]
    config = RunConfig(worker_num=workers, record=folder, progress=False)
    results = Runners.sync_run_task(tasks, config)
    assert [r.value for r in results] == [1.0, True], [r.error for r in results]


async def plays_and_notes(session: EpisodeSession) -> str:
    await session.reset()
    await session.step({"message": "hi"})
    await asyncio.to_thread(note, session.input, session.task.id)  # from any process
    return "played"


def note(journal: str, line: str) -> None:
    with Path(journal).open("a") as file:
        file.write(f"{line}\n")


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "processes"])
def test_a_record_folder_that_cannot_be_written_fails_the_run_before_any_episode(
    tmp_path: Path, workers: int
) -> None:
    # It used to be found when the first episode ended: every episode was
    # played to the end, then reported as an error, its value lost.
    blocker, journal = tmp_path / "a-file", tmp_path / "journal"
    blocker.write_text("not a folder")
    tasks = [
        Task(id=f"t{i}", env=EchoEnvironment, agent=plays_and_notes, input=str(journal))
        for i in range(3)
    ]
    for folder in (blocker, blocker / "rec"):
        config = RunConfig(worker_num=workers, record=str(folder), progress=False)
        with pytest.raises(ValueError, match=f"cannot record into {folder}: "):
            Runners.sync_run_task(tasks, config)
    assert not journal.exists()  # no episode was played
    assert blocker.read_text() == "not a folder"


def test_openenv_run_names_a_record_folder_it_cannot_write_before_playing(
    echo_url: str, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = tmp_path / "results.jsonl"
    command = ["run", "--env", echo_url, "--tasks", "2", "--no-progress"]
    outcome = CliRunner().invoke(cli, [*command, "--out", str(out), "--record", str(blocker)])
    assert outcome.exit_code == 2, outcome.output
    assert f"cannot record into {blocker}: " in " ".join(outcome.output.split())
    assert not out.exists() or out.read_bytes() == b""  # no episode was played


async def meets_its_round(session: EpisodeSession) -> str:
    """Says hi once the other task of its round is playing too (so, with one
    episode per worker process, both processes play every round)."""
    journal, round_ = session.input
    await session.reset()
    await asyncio.to_thread(note, journal, round_)
    loop = asyncio.get_running_loop()
    end = loop.time() + 60
    while (await asyncio.to_thread(Path(journal).read_text)).count(round_) < 2:
        if loop.time() > end:
            return "alone"
        await asyncio.sleep(0.01)
    return str((await session.step({"message": "hi"})).observation.echoed_message)


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "processes"])
def test_each_run_records_into_the_folder_of_that_name_when_it_runs(
    tmp_path: Path, workers: int
) -> None:
    # A training loop records each round into "current", then moves it aside.
    # The process (and the worker processes, kept for the next run) used to keep
    # its file open: round 1 went on into round 0's moved folder, "current" empty.
    current, journal = tmp_path / "current", str(tmp_path / "journal")
    for round_ in ("a", "b"):
        tasks = [
            Task(
                id=f"{round_}{i}",
                env=EchoEnvironment,
                agent=meets_its_round,
                input=(journal, round_),
            )
            for i in range(2)
        ]
        config = RunConfig(
            worker_num=workers, max_concurrency=3 - workers, record=str(current), progress=False
        )
        assert [r.value for r in Runners.sync_run_task(tasks, config)] == ["hi"] * 2
        current.rename(tmp_path / f"round-{round_}")
    for round_ in ("a", "b"):
        episodes = load(tmp_path / f"round-{round_}")
        assert sorted(e.session for e in episodes) == [f"{round_}0", f"{round_}1"]


async def echoes(session: EpisodeSession) -> str:
    await session.reset()
    return str((await session.step({"message": "hi"})).observation.echoed_message)


def test_each_sub_episode_of_a_parallel_agent_is_recorded_with_how_it_ended(
    tmp_path: Path,
) -> None:
    both = ParallelizableAgent(agents=[echoes, hangs_after_reset])
    tasks = [
        Task(id="quick", env=EchoEnvironment, agent=ParallelizableAgent(agents=[echoes, echoes])),
        Task(id="slow", env=EchoEnvironment, agent=both, timeout=0.5),
    ]
    config = RunConfig(record=str(tmp_path / "rec"), progress=False)
    results = Runners.sync_run_task(tasks, config)
    assert [r.status.value for r in results] == ["ok", "timeout"]

    episodes = {e.session: [s.kind for s in e.steps] for e in load(tmp_path / "rec")}
    assert episodes == {
        "quick/fork-1": ["reset", "step"],
        "quick/fork-2": ["reset", "step"],
        "slow/fork-1": ["reset", "step"],
        "slow/fork-2": ["reset", "state"],
    }
    (file,) = (tmp_path / "rec").glob("runner-*.jsonl")
    closed = {
        event["session"]: (event["task"], event["reason"])
        for event in map(orjson.loads, file.read_bytes().splitlines())
        if event["event"] == "closed"
    }
    # The sub-episode the deadline cut short ended as the task did: once "CancelledError".
    assert closed == {
        "quick": ("quick", "ok"),
        "quick/fork-1": ("quick", "ok"),
        "quick/fork-2": ("quick", "ok"),
        "slow": ("slow", "TimeoutError"),
        "slow/fork-1": ("slow", "ok"),
        "slow/fork-2": ("slow", "TimeoutError"),
    }


def test_an_episode_whose_recording_fails_still_gives_back_its_session(tmp_path: Path) -> None:
    """A recording that cannot be written (here: the folder replaced by a file
    mid-run) fails that episode, and its session and slot go back all the same:
    on a server of one slot, the next task plays."""
    folder = tmp_path / "rec"
    played: list[str] = []

    async def agent(session: EpisodeSession) -> float:
        await session.reset()
        await session.step(EchoAction(message="hi"))
        played.append(session.task.id)
        if folder.is_dir():  # the first episode puts a file in the recording's way
            shutil.rmtree(folder)
            folder.write_text("in the way")
        return 1.0

    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, ConcurrencyConfig(max_concurrent_envs=1)
    )
    with run_server(app) as url:
        tasks = [Task(id=f"t{i}", env=url, agent=agent) for i in range(2)]
        config = RunConfig(record=str(folder), progress=False, max_concurrency=1, retries=0)
        results = Runners.sync_run_task(tasks, config)
    assert played == ["t0", "t1"]
    assert [r.error.type if r.error else None for r in results] == ["FileExistsError"] * 2


def test_the_record_folder_may_be_a_path(tmp_path: Path) -> None:
    """``RunConfig(record=tmp_path / "rec")``: refused as "not a valid string" before."""

    async def say_hi(session: EpisodeSession) -> None:
        await session.reset()
        await session.step(EchoAction(message="hi"))

    config = RunConfig(record=tmp_path / "rec", progress=False)  # type: ignore[arg-type]
    assert config.record == str(tmp_path / "rec")
    results = Runners.sync_run_task([Task(id="p0", env=EchoEnvironment, agent=say_hi)], config)
    assert results[0].ok, results[0].msg
    assert [(e.session, len(e.steps)) for e in load(tmp_path / "rec")] == [("p0", 2)]


def _lying_server(step_reply: str | bytes) -> Any:
    """A server of the v1 protocol (not openenv) that answers a reset pretty-printed,
    as some JSON libraries write by default, and a step with ``step_reply``."""

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            kind = orjson.loads(frame)["type"]
            if kind == "close":
                return
            if kind == "reset":
                reset = {"type": "observation", "data": {"observation": {"n": 0}, "done": False}}
                await ws.send(orjson.dumps(reset, option=orjson.OPT_INDENT_2).decode())
            else:
                await ws.send(step_reply)

    return serve(handler, "127.0.0.1", 0)


@pytest.mark.parametrize(
    "step_reply",
    [
        '{"type": "observation",\n "data": {"observation": {"n": 1}, "reward": 1.0, "done": true}}',
        "{not json, though it looks like an object}",
        b"\xff\xfe not even text",
    ],
    ids=["pretty-printed", "braced-garbage", "binary-garbage"],
)
async def test_replies_that_span_lines_or_are_no_json_keep_the_recording_readable(
    tmp_path: Path, step_reply: str | bytes
) -> None:
    """trajectories.md: each call holds the reply "exactly as it crossed the wire",
    and ``load`` reads the file back. A reply embedded unchecked split its line at
    each line break (or was no JSON at all), and ``load`` dropped the episode as
    lines "cut short by a kill"."""

    async def agent(session: EpisodeSession) -> None:
        await session.reset()
        await session.step({"message": "hi"})

    async with _lying_server(step_reply) as server:
        port = server.sockets[0].getsockname()[1]
        task = Task(id="t", env=f"http://127.0.0.1:{port}", agent=agent)
        config = RunConfig(record=str(tmp_path / "rec"), progress=False, retries=0)
        (result,) = await Runners.run_task([task], config)
    (file,) = (tmp_path / "rec").glob("runner-*.jsonl")
    events = [orjson.loads(line) for line in file.read_bytes().splitlines()]
    assert [e["event"] for e in events] == ["opened", "call", "call", "closed"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing skipped as unreadable
        (episode,) = load(tmp_path / "rec")
    assert [s.kind for s in episode.steps] == ["reset", "step"]
    assert episode.steps[0].observation == {"n": 0}
    if result.ok:  # the client reads pretty-printed JSON; the recording holds it as sent
        assert episode.steps[1].reply["data"]["observation"] == {"n": 1}
        assert episode.ended == "ok"
    else:  # a reply that is no JSON ends the episode, and is kept as what it was
        assert "invalid_frame" in episode.steps[1].reply
        assert episode.ended == result.error.type
