"""Server-side recording: sessions on disk, read back as episodes, replayed, tabled."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from websockets.asyncio.client import connect

from echo_env.models import EchoAction, EchoObservation
from echo_env.server.environment import EchoEnvironment
from openenv import Action, ConcurrencyConfig, Environment, Observation, State, create_app
from openenv.client import WebSocketEnvClient, ws_url
from openenv.testing import run_server
from openenv.trajectories import load, replay, replay_all, to_parquet, to_rows
from wordle_env import WordleAction, WordleEnv, WordleTask
from wordle_env.models import WordleObservation
from wordle_env.server.environment import WordleEnvironment


def wordle_app(record: Path | None = None) -> Any:
    return create_app(
        WordleEnvironment,
        WordleAction,
        WordleObservation,
        ConcurrencyConfig(max_concurrent_envs=4),
        record=None if record is None else str(record),
    )


async def play_two_games(url: str) -> None:
    async with WordleEnv(url) as env:
        await env.reset(task=WordleTask(id="test-0000"))  # "abbey"
        await env.step(WordleAction(guess="xyzzy"))  # not a word: no guess used
        await env.step(WordleAction(guess="abbot"))
        await env.step(WordleAction(guess="abbey"))
        await env.reset(task=WordleTask(id="test-0001"))
        await env.step(WordleAction(guess="crane"))


def test_a_recorded_run_reads_back_with_every_step_in_order(tmp_path: Path) -> None:
    with run_server(wordle_app(tmp_path / "rec")) as url:
        asyncio.run(play_two_games(url))
    episodes = load(tmp_path / "rec")
    assert [len(e.steps) for e in episodes] == [4, 2]
    first, second = episodes
    assert first.session == second.session
    assert [s.kind for s in first.steps] == ["reset", "step", "step", "step"]
    assert [s.request for s in first.steps[1:]] == [
        {"guess": "xyzzy"},
        {"guess": "abbot"},
        {"guess": "abbey"},
    ]
    assert [s.reward for s in first.steps[1:]] == [None, 0.0, 1.0]
    assert [s.done for s in first.steps] == [False, False, False, True]
    assert first.total_reward == 1.0
    assert first.steps[3].reply["data"]["metadata"]["reward_parts"]["solved"] == 1.0
    assert all(s.started <= s.ended for s in first.steps)
    assert first.steps[0].request["task"]["id"] == "test-0000"
    # The first ended at the second's reset; the second with its session's close.
    (file,) = (tmp_path / "rec").glob("*.jsonl")
    closed = orjson.loads(file.read_bytes().splitlines()[-1])
    assert closed["event"] == "closed"
    assert [e.ended for e in episodes] == ["reset", closed["reason"]]
    # What a killed server leaves (no closed event): the last episode has no end.
    file.write_bytes(b"".join(file.read_bytes().splitlines(keepends=True)[:-1]))
    assert [e.ended for e in load(file)] == ["reset", None]


def test_an_episode_that_begins_with_a_step_counts_that_steps_reward(tmp_path: Path) -> None:
    # OpenEnv's POST /step is a session of one step, never reset; a /ws client may
    # also step before any reset. Only a reset's reward is left out of the total.
    import httpx

    app = create_app(EchoEnvironment, EchoAction, EchoObservation, record=str(tmp_path / "rec"))
    with run_server(app) as url:
        stepped = httpx.post(f"{url}/step", json={"action": {"message": "hello"}})
        assert stepped.json()["reward"] == 0.5
    (episode,) = load(tmp_path / "rec")
    assert [s.kind for s in episode.steps] == ["step"]
    assert episode.total_reward == 0.5


def test_rows_round_trip_through_parquet(tmp_path: Path) -> None:
    with run_server(wordle_app(tmp_path / "rec")) as url:
        asyncio.run(play_two_games(url))
    episodes = load(tmp_path / "rec")
    rows = to_rows(episodes)
    assert [(r["episode"], r["step"], r["kind"]) for r in rows] == [
        (0, 0, "reset"),
        (0, 1, "step"),
        (0, 2, "step"),
        (0, 3, "step"),
        (1, 0, "reset"),
        (1, 1, "step"),
    ]
    path = to_parquet(episodes, tmp_path / "steps.parquet")
    assert pq.read_table(path).to_pylist() == rows


def test_a_replay_of_a_deterministic_environment_matches(tmp_path: Path) -> None:
    with run_server(wordle_app(tmp_path / "rec")) as url:
        asyncio.run(play_two_games(url))
    episodes = load(tmp_path / "rec")
    with run_server(wordle_app()) as fresh:
        assert replay_all(episodes, fresh) == {f"{e.session}/{e.index}": [] for e in episodes}


class Coin(Action):
    pass


class Toss(Observation):
    side: str


class Unseeded(Environment[Coin, Toss, State]):
    """Ignores the seed: a replay cannot match it."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Toss:
        return Toss(side="start")

    def step(self, action: Coin, **kwargs: Any) -> Toss:
        return Toss(side=uuid.uuid4().hex)

    @property
    def state(self) -> State:
        return State()


def test_a_raw_websocket_session_is_recorded_and_a_replay_finds_what_differs(
    tmp_path: Path,
) -> None:
    app = create_app(Unseeded, Coin, Toss, record=str(tmp_path / "rec"))

    async def raw(url: str) -> None:
        async with connect(ws_url(url)) as ws:
            for frame in (b'{"type":"reset","data":{"seed":3}}', b'{"type":"step","data":{}}'):
                await ws.send(frame.decode())
                await ws.recv()
            await ws.send("not json at all")
            assert orjson.loads(await ws.recv())["data"]["code"] == "INVALID_JSON"

    with run_server(app) as url:
        asyncio.run(raw(url))
        (episode,) = load(tmp_path / "rec")
        assert [s.kind for s in episode.steps] == ["reset", "step", "invalid"]
        assert episode.steps[0].request == {"seed": 3}
        assert asyncio.run(replay(episode, url)) == [1]  # the toss, and only the toss


class Size(Action):
    n: int


class Blob(Observation):
    data: str = ""


class BlobEnvironment(Environment[Size, Blob, State]):
    """Observations of the size asked for."""

    def reset(self, seed: Any = None, episode_id: Any = None, **kwargs: Any) -> Blob:
        return Blob()

    def step(self, action: Size, **kwargs: Any) -> Blob:
        return Blob(data="x" * action.n)

    @property
    def state(self) -> State:
        return State()


def test_an_episode_of_observations_past_a_mebibyte_replays(tmp_path: Path) -> None:
    # The client took the 2 MB reply; replay, at websockets' 1 MiB default, once
    # failed with "message too big" instead of comparing it.
    app = create_app(BlobEnvironment, Size, Blob, record=str(tmp_path / "rec"))

    async def play(url: str) -> None:
        async with WebSocketEnvClient(url, action_cls=Size, observation_cls=Blob) as env:
            await env.reset()
            assert len((await env.step(Size(n=2_000_000))).observation.data) == 2_000_000

    with run_server(app) as url:
        asyncio.run(play(url))
        (episode,) = load(tmp_path / "rec")
        assert [s.kind for s in episode.steps] == ["reset", "step"]
        assert asyncio.run(replay(episode, url)) == []


def test_a_recording_that_cannot_be_written_does_not_end_the_sessions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A full disk once raised out of every recorded reply: each session's
    # connection dropped without a close frame, and the shutdown failed.
    app = create_app(BlobEnvironment, Size, Blob, record=str(tmp_path / "rec"))

    async def play(url: str) -> list[int]:
        sizes = []
        for _ in range(2):
            async with WebSocketEnvClient(url, action_cls=Size, observation_cls=Blob) as env:
                await env.reset()
                for _ in range(3):  # each reply past the file's buffer: written at once
                    sizes.append(len((await env.step(Size(n=100_000))).observation.data))
        return sizes

    with run_server(app) as url:
        recorder = app.state.openenv.recorder
        recorder._file.close()
        # /dev/full: a real device, every write to which fails with ENOSPC.
        recorder._file = open("/dev/full", "ab", buffering=1 << 16)  # noqa: SIM115
        assert asyncio.run(play(url)) == [100_000] * 6
    errors = [m for r in caplog.records if "cannot write the recording" in (m := r.getMessage())]
    assert len(errors) == 1
    assert errors[0].endswith("events are lost: [Errno 28] No space left on device")


def test_the_file_holds_the_session_from_open_to_close(tmp_path: Path) -> None:
    with run_server(wordle_app(tmp_path / "rec")) as url:
        asyncio.run(play_two_games(url))
    (file,) = (tmp_path / "rec").glob("*.jsonl")
    events = [orjson.loads(line)["event"] for line in file.read_bytes().splitlines()]
    assert events[0] == "opened"
    assert events[-1] == "closed"
    assert events.count("call") == 6


def echo_app(record: Path) -> Any:
    return create_app(EchoEnvironment, EchoAction, EchoObservation, record=str(record))


async def send_each(url: str, frames: list[str]) -> list[dict[str, Any]]:
    """Each frame on one raw WebSocket; the replies."""
    replies = []
    async with connect(ws_url(url)) as ws:
        for frame in frames:
            await ws.send(frame)
            replies.append(orjson.loads(await ws.recv()))
    return replies


def test_a_frame_spanning_lines_is_recorded_on_one_line(tmp_path: Path) -> None:
    # JSON allows line breaks between tokens: a client's pretty-printed frame,
    # one ending in a newline. Each used to be embedded as is, splitting its event
    # over lines that load() skipped (or, for a line like "    2", choked on).
    frames = [
        json.dumps({"type": "reset", "data": {"seed": 1, "tags": [1, 2]}}, indent=2),
        json.dumps({"type": "step", "data": {"message": "hi"}}) + "\n",
        '{"type": "step",\r\n "data": {"message": "again"}}',
    ]
    with run_server(echo_app(tmp_path / "rec")) as url:
        replies = asyncio.run(send_each(url, frames))
        assert [r["type"] for r in replies] == ["observation", "observation", "observation"]
        (file,) = (tmp_path / "rec").glob("*.jsonl")
        events = [orjson.loads(line) for line in file.read_bytes().splitlines()]
        assert [e["event"] for e in events] == ["opened", "call", "call", "call", "closed"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no line skipped
            (episode,) = load(tmp_path / "rec")
        assert [s.kind for s in episode.steps] == ["reset", "step", "step"]
        assert [s.request for s in episode.steps] == [
            {"seed": 1, "tags": [1, 2]},
            {"message": "hi"},
            {"message": "again"},
        ]
        assert [s.reply for s in episode.steps] == replies
        assert asyncio.run(replay(episode, url)) == []


def test_a_refused_frame_that_is_json_but_not_an_object_replays(tmp_path: Path) -> None:
    frames = ['{"type": "reset"}', "[1, 2]", '"step"', "null", "not json"]
    with run_server(echo_app(tmp_path / "rec")) as url:
        replies = asyncio.run(send_each(url, frames))
        assert [r["data"].get("code") for r in replies[1:]] == ["INVALID_JSON"] * 4
        (episode,) = load(tmp_path / "rec")
        assert [s.kind for s in episode.steps] == ["reset", *["invalid"] * 4]
        assert [s.request for s in episode.steps[1:4]] == [[1, 2], "step", None]
        # Once an AttributeError ('list' object has no attribute 'get').
        assert asyncio.run(replay(episode, url)) == []


def test_load_skips_a_line_that_is_json_but_not_an_event(tmp_path: Path) -> None:
    with run_server(echo_app(tmp_path / "rec")) as url:
        asyncio.run(send_each(url, ['{"type": "reset"}']))
    (file,) = (tmp_path / "rec").glob("*.jsonl")
    with file.open("ab") as out:
        out.write(b"2\n[1]\n")  # once an AttributeError out of load()
    with pytest.warns(UserWarning, match=rf"not JSON objects: {file.name} \(2\)"):
        (episode,) = load(tmp_path / "rec")
    assert [s.kind for s in episode.steps] == ["reset"]


def test_a_recording_folder_that_is_a_file_is_refused_at_start(tmp_path: Path) -> None:
    # The server started, then stopped inside its lifespan with a raw FileExistsError.
    taken = tmp_path / "recordings"
    taken.write_text("not a folder")
    with pytest.raises(ValueError, match="record") as refused:
        create_app(EchoEnvironment, EchoAction, EchoObservation, record=str(taken))
    assert "is a file" in str(refused.value)
    echo = Path(__file__).parents[1] / "envs" / "echo_env"
    openenv = Path(sys.executable).with_name("openenv")
    served = subprocess.run(
        [openenv, "serve", str(echo), "--port", "0"],
        env={**os.environ, "OPENENV_RECORD": str(taken)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served.returncode == 1, served.stderr
    assert "record" in served.stderr, served.stderr
    assert "is a file" in served.stderr, served.stderr
    assert "Traceback" not in served.stderr, served.stderr


def test_the_record_folder_may_be_a_path(tmp_path: Path) -> None:
    """``create_app(record=tmp_path / "rec")``: refused as "not a valid string" before."""
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, record=tmp_path / "rec")
    with run_server(app) as url:
        env = WebSocketEnvClient(url, action_cls=EchoAction, observation_cls=EchoObservation)
        with env.sync() as played:
            played.reset()
            played.step(EchoAction(message="hi"))
    (episode,) = load(tmp_path / "rec")
    assert [s.kind for s in episode.steps] == ["reset", "step"]
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    with pytest.raises(ValueError, match="is a file"):  # checked as a str is
        create_app(EchoEnvironment, EchoAction, EchoObservation, record=taken)


class Said(Observation):
    text: str = ""


class Saying(Environment[Coin, Said, State]):
    """Deterministic, and says what it did in its observations' metadata."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Said:
        return Said(text="start")

    def step(self, action: Coin, **kwargs: Any) -> Said:
        return Said(text="tossed", metadata={"event": "toss", "n": 1})

    @property
    def state(self) -> State:
        return State()


def test_a_recording_replays_whether_its_metadata_is_among_the_fields_or_only_beside(
    tmp_path: Path,
) -> None:
    # An observation's non-empty metadata now travels among its fields too;
    # recordings made before have it beside them only. Replayed against the
    # same deterministic environment, every step with metadata was reported as
    # differing (or, the other way, every new recording against an older server).
    app = create_app(Saying, Coin, Said, record=str(tmp_path / "rec"))

    async def play(url: str) -> None:
        async with WebSocketEnvClient(url, action_cls=Coin, observation_cls=Said) as env:
            await env.reset()
            assert (await env.step(Coin())).observation.metadata == {"event": "toss", "n": 1}

    with run_server(app) as url:
        asyncio.run(play(url))
        (recorded,) = load(tmp_path / "rec")
        (step_reply,) = [s.reply for s in recorded.steps if s.kind == "step"]
        fields = step_reply["data"]["observation"]
        among, beside = dict(fields), {k: v for k, v in fields.items() if k != "metadata"}
        among["metadata"] = step_reply["data"]["metadata"]
        for shape in (among, beside):
            step_reply["data"]["observation"] = shape
            assert asyncio.run(replay(recorded, url)) == []
        step_reply["data"]["observation"] = {**among, "metadata": {"event": "other"}}
        assert asyncio.run(replay(recorded, url)) == [1]  # a metadata that differs still does
