"""The Wordle environment against a real server on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from pathlib import Path

import httpx
import pytest

from openenv import EnvExecutionError, EnvSession, EnvValidationError, RemoteEnv
from openenv.testing import run_server
from wordle_env import WordleAction, WordleEnv, WordleObservation, WordleState, WordleTask
from wordle_env.server.app import app
from wordle_env.server.words import answers, pattern, score


@pytest.mark.parametrize(
    ("guess", "answer", "expected"),
    [
        ("abbot", "abbey", "GGG--"),
        ("babes", "abbey", "YYGG-"),  # the second b is in place, the first one elsewhere
        ("lllll", "hello", "--GG-"),  # only as many marks as the answer has l's
        ("hello", "llama", "--YY-"),
        ("abbey", "abbey", "GGGGG"),
    ],
)
def test_feedback_follows_wordle_rules(guess: str, answer: str, expected: str) -> None:
    assert pattern(score(guess, answer)) == expected


def test_splits_list_ids_only() -> None:
    with run_server(app) as url:
        env = RemoteEnv(url).sync()
        assert env.list_splits() == ["train", "test"]
        test = env.list_tasks("test")
        train = env.list_tasks("train")
    assert (len(train), len(test)) == (1860, 300)
    assert test[0].model_dump() == {"id": "test-0000"}  # no word given away
    assert not set(answers("train")) & set(answers("test"))


def test_a_won_game_through_the_client() -> None:
    with run_server(app) as url, WordleEnv(url).sync() as env:
        first = env.reset(task=WordleTask(id="test-0000"))  # "abbey"
        assert first.observation.message.startswith("Guess the secret five-letter English word")
        assert (first.observation.guesses_left, first.done) == (6, False)

        unknown = env.step(WordleAction(guess="xyzzy"))
        assert isinstance(unknown.observation, WordleObservation)
        assert unknown.observation.message == "'xyzzy' is not in the word list; no guess was used"
        assert (unknown.observation.guesses_left, unknown.observation.board) == (6, [])
        assert (unknown.reward, unknown.done) == (None, False)
        with pytest.raises(EnvValidationError, match=r"should match pattern"):
            env.step({"guess": "abc"})
        with pytest.raises(EnvValidationError):
            env.step({"guess": "ab3ey"})

        first_try = env.step(WordleAction(guess="ABBOT"))  # case does not matter
        row = first_try.observation.board[-1]
        assert (row.guess, row.pattern) == ("abbot", "GGG--")
        assert row.letters == ["correct", "correct", "correct", "absent", "absent"]
        assert (first_try.reward, first_try.done, first_try.observation.guesses_left) == (
            0.0,
            False,
            5,
        )
        assert first_try.observation.message == "5 guesses left"
        # The rubric's parts travel with the reward: 3 of 5 letters in place.
        assert first_try.observation.metadata["reward_parts"] == {"solved": 0.0, "greens": 0.6}
        assert env.state().answer is None  # not before the game is over

        won = env.step(WordleAction(guess="abbey"))
        assert (won.reward, won.done) == (1.0, True)
        assert won.observation.metadata["reward_parts"] == {"solved": 1.0, "greens": 1.0}
        assert won.observation.message == "solved in 2 guesses"
        assert won.observation.answer == "abbey"
        state = env.state()
        assert isinstance(state, WordleState)
        assert (state.task_id, state.guesses, state.solved, state.done, state.answer) == (
            "test-0000",
            ["abbot", "abbey"],
            True,
            True,
            "abbey",
        )
        with pytest.raises(EnvExecutionError, match="the game is over"):
            env.step(WordleAction(guess="crane"))
        assert env.reset(seed=1).done is False  # the session goes on


def test_six_wrong_guesses_lose_the_game() -> None:
    wrong = ["crane", "sloth", "dumpy", "fight", "wacky", "jumbo"]
    with run_server(app) as url, WordleEnv(url).sync() as env:
        env.reset(task=WordleTask(id="test-0000"))  # "abbey"
        for guess in wrong[:-1]:
            assert env.step(WordleAction(guess=guess)).done is False
        lost = env.step(WordleAction(guess=wrong[-1]))
        assert (lost.reward, lost.done, lost.observation.guesses_left) == (0.0, True, 0)
        assert lost.observation.message == "out of guesses: the word was 'abbey'"
        assert [row.guess for row in lost.observation.board] == wrong
        with pytest.raises(EnvExecutionError, match="unknown task 'test-9999'"):
            env.reset(task=WordleTask(id="test-9999"))


@pytest.mark.parametrize(
    "task_id",
    [
        "test-0300",
        "train-²",
        "train-\uff11\uff12\uff13\uff14",
        "train-00001",
        "test-0000 ",
        "test-+001",
        "test-",
    ],
)
def test_only_the_listed_task_ids_are_accepted(task_id: str) -> None:
    with run_server(app) as url, WordleEnv(url).sync() as env:
        # Each is refused with the list of ids, not taken for another task or a crash.
        with pytest.raises(EnvExecutionError, match=r"unknown task .*test-0000\.\.test-0299"):
            env.reset(task=WordleTask(id=task_id))
        env.reset(task=WordleTask(id="test-0001"))
        assert env.state().task_id == "test-0001"


async def solve(session: EnvSession) -> tuple[float, list[str]]:
    """A tool-calling agent: guess the first test word consistent with the feedback."""
    candidates = sorted(answers("test"))
    guesses: list[str] = []
    while True:
        guess = candidates[0]
        output = await session.call_tool("guess", word=guess)
        guesses.append(guess)
        if output.finished:
            return output.reward or 0.0, guesses
        row = output.data["board"][-1]["pattern"]
        candidates = [w for w in candidates if pattern(score(guess, w)) == row]


def play_locally(answer: str) -> tuple[float, list[str]]:
    """The same agent against the same rules, without a server."""
    candidates = sorted(answers("test"))
    guesses: list[str] = []
    while len(guesses) < 6:
        guess = candidates[0]
        guesses.append(guess)
        if guess == answer:
            return 1.0, guesses
        row = pattern(score(guess, answer))
        candidates = [w for w in candidates if pattern(score(guess, w)) == row]
    return 0.0, guesses


def test_50_concurrent_tool_sessions() -> None:
    async def main(url: str) -> list[tuple[float, list[str]]]:
        env = RemoteEnv(url, task_cls=WordleTask)
        tasks = await env.list_tasks("test", limit=50)

        async def one(task: WordleTask) -> tuple[float, list[str]]:
            async with env.session(task) as session:
                assert (await session.get_prompt()).startswith("Guess the secret")
                return await solve(session)

        return await asyncio.gather(*(one(task) for task in tasks))  # type: ignore[arg-type]

    with run_server(app) as url:
        results = asyncio.run(main(url))
        assert httpx.get(f"{url}/health").json()["active_sessions"] == 0
    expected = [play_locally(word) for word in answers("test")[:50]]
    assert results == expected


def test_the_readme_example_prints_what_it_says() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    drive = readme.split("## Drive", 1)[1]
    code = re.findall(r"```python\n(.*?)```", drive, re.DOTALL)[0]
    printed = re.findall(r"```text\n(.*?)```", drive, re.DOTALL)[0]
    out = io.StringIO()
    with run_server(app) as url, contextlib.redirect_stdout(out):
        exec(compile(code.replace("http://localhost:8000", url), "README.md", "exec"), {})
    assert out.getvalue() == printed
