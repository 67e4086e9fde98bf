"""What the Wordle environment's agents send and receive."""

from typing import Literal

from pydantic import BaseModel, Field

from openenv import Action, Observation, State, TaskSpec

LetterResult = Literal["correct", "present", "absent"]
WORD_PATTERN = "^[A-Za-z]{5}$"


class WordleTask(TaskSpec):
    """One secret word, named by its id only (the server keeps the word)."""


class WordleAction(Action):
    """A guess: any five letters; a word the game does not know uses no guess."""

    guess: str = Field(pattern=WORD_PATTERN, description="A five-letter English word.")


class GuessFeedback(BaseModel):
    """One row of the board."""

    guess: str
    pattern: str = Field(
        description="Per letter: G right place, Y elsewhere in the word, - not in it."
    )
    letters: list[LetterResult]


class WordleObservation(Observation):
    """The board so far, and what the last guess did."""

    board: list[GuessFeedback] = Field(default_factory=list)
    guesses_left: int = 6
    message: str = ""
    answer: str | None = Field(default=None, description="Revealed when the episode ends.")


class WordleState(State):
    """The episode's task and guesses; the answer only once it is over."""

    task_id: str | None = None
    guesses: list[str] = Field(default_factory=list)
    solved: bool = False
    done: bool = False
    answer: str | None = None
