"""The Wordle environment itself."""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field

from openenv import EnvError, Environment, JsonContent, TextContent, ToolOutput, tool
from wordle_env.models import (
    WORD_PATTERN,
    GuessFeedback,
    WordleAction,
    WordleObservation,
    WordleState,
    WordleTask,
)
from wordle_env.server.rubric import wordle_rubric
from wordle_env.server.words import SPLITS, allowed_words, answers, pattern, score

__all__ = ["MAX_GUESSES", "WordleEnvironment", "tasks"]

MAX_GUESSES = 6
_INDEX = re.compile("[0-9]{4}")


@functools.cache
def tasks(split: str) -> tuple[WordleTask, ...]:
    """The tasks of ``split``: ids only, so listing them gives no word away."""
    return tuple(WordleTask(id=f"{split}-{i:04d}") for i in range(len(answers(split))))


class WordleEnvironment(Environment[WordleAction, WordleObservation, WordleState]):
    """Guess the secret word in six tries; reward 1.0 for solving it.

    A guess that is not a known word is refused with a message and uses no try.

    >>> env = WordleEnvironment()
    >>> _ = env.reset(task=WordleTask(id="test-0000"))  # the word is "abbey"
    >>> env.step(WordleAction(guess="xyzzy")).message
    "'xyzzy' is not in the word list; no guess was used"
    >>> obs = env.step(WordleAction(guess="abbot"))
    >>> obs.board[-1].pattern, obs.guesses_left, obs.done
    ('GGG--', 5, False)
    >>> obs = env.step(WordleAction(guess="abbey"))
    >>> obs.reward, obs.done, obs.message
    (1.0, True, 'solved in 2 guesses')
    """

    # The word lists are read-only; everything else lives on the instance.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._answer = answers("train")[0]
        self._board: list[GuessFeedback] = []
        self._state = WordleState(episode_id=uuid.uuid4().hex, task_id=tasks("train")[0].id)
        self.rubric = wordle_rubric()

    @classmethod
    def list_splits(cls) -> Sequence[str]:
        return SPLITS

    @classmethod
    def list_tasks(cls, split: str) -> Sequence[WordleTask]:
        return tasks(split)

    @classmethod
    def get_prompt(cls, task: WordleTask) -> str:  # type: ignore[override]
        return (
            f"Guess the secret five-letter English word in at most {MAX_GUESSES} guesses. "
            f"After each guess every letter is marked: G (right letter, right place), "
            f"Y (in the word, elsewhere) or - (not in the word). A guess that is not a "
            f"known word uses no try."
        )

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task: WordleTask | None = None,
        **kwargs: Any,
    ) -> WordleObservation:
        """A new game for ``task``; without one, the ``seed``-th training word."""
        if task is None:
            task = tasks("train")[(seed or 0) % len(tasks("train"))]
        self._answer = _answer_of(task)
        self._board = []
        self._state = WordleState(episode_id=episode_id or uuid.uuid4().hex, task_id=task.id)
        return WordleObservation(message=self.get_prompt(task))

    def step(self, action: WordleAction, **kwargs: Any) -> WordleObservation:
        return self._guess(action.guess)

    @property
    def state(self) -> WordleState:
        return self._state

    @tool
    def guess(
        self, word: Annotated[str, Field(pattern=WORD_PATTERN, description="A five-letter word.")]
    ) -> ToolOutput:
        """Guess the word; see which letters are in place (G), elsewhere (Y) or absent (-).

        Args:
            word: A five-letter English word.
        """
        observation = self._guess(word)
        lines = [f"{row.guess.upper()} {row.pattern}" for row in observation.board]
        lines.append(observation.message)
        return ToolOutput(
            content=[
                TextContent(text="\n".join(lines)),
                JsonContent(data=observation.model_dump(exclude={"reward", "done", "metadata"})),
            ],
            reward=observation.reward,
            finished=observation.done,
        )

    def _guess(self, word: str) -> WordleObservation:
        state = self._state
        if state.done:
            raise EnvError("the game is over; reset() to play another")
        word = word.lower()
        if word not in allowed_words():
            return self._observation(f"{word!r} is not in the word list; no guess was used")
        results = score(word, self._answer)
        self._board.append(GuessFeedback(guess=word, pattern=pattern(results), letters=results))
        state.guesses.append(word)
        state.step_count += 1
        state.solved = word == self._answer
        state.done = state.solved or len(state.guesses) >= MAX_GUESSES
        if state.done:
            state.answer = self._answer
        if state.solved:
            tries = len(state.guesses)
            message = f"solved in {tries} guess{'es' if tries > 1 else ''}"
        elif state.done:
            message = f"out of guesses: the word was {self._answer!r}"
        else:
            message = f"{MAX_GUESSES - len(state.guesses)} guesses left"
        observation = self._observation(message)
        self.rubric(word, observation)
        # reward, and metadata["reward_parts"]: {"solved": ..., "greens": ...}
        return self.rubric.annotate(observation)

    def _observation(self, message: str, reward: float | None = None) -> WordleObservation:
        state = self._state
        return WordleObservation(
            board=list(self._board),
            guesses_left=MAX_GUESSES - len(state.guesses),
            message=message,
            answer=state.answer,
            reward=reward,
            done=state.done,
        )


def _answer_of(task: WordleTask) -> str:
    # Only the ids tasks() lists: str.isdigit() and int() also take "²" and fullwidth digits.
    split, _, index = task.id.partition("-")
    if split in SPLITS and _INDEX.fullmatch(index) and int(index) < len(answers(split)):
        return answers(split)[int(index)]
    raise EnvError(
        f"unknown task {task.id!r}: ids are train-0000..train-{len(answers('train')) - 1:04d} "
        f"and test-0000..test-{len(answers('test')) - 1:04d}"
    )
