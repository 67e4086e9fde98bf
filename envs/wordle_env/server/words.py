"""The word lists shipped in ``data/`` and the scoring of a guess.

>>> score("crane", "cacao")
['correct', 'absent', 'present', 'absent', 'absent']
>>> score("llama", "hello")  # a repeated letter is marked only as often as it occurs
['present', 'present', 'absent', 'absent', 'absent']
>>> "crane" in allowed_words(), len(answers("test"))
(True, 300)
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

from wordle_env.models import LetterResult

__all__ = ["SPLITS", "allowed_words", "answers", "pattern", "score"]

_DATA = Path(__file__).parent / "data"
SPLITS = ("train", "test")


@functools.cache
def answers(split: str) -> tuple[str, ...]:
    """The secret words of ``split``, in a stable order."""
    return tuple(_read(f"answers-{split}.txt"))


@functools.cache
def allowed_words() -> frozenset[str]:
    """Every word a guess may be (the answers included)."""
    return frozenset(_read("allowed.txt")).union(*(answers(split) for split in SPLITS))


def score(guess: str, answer: str) -> list[LetterResult]:
    """Wordle's feedback: right letters in place first, then others while the answer has them."""
    results: list[LetterResult] = ["absent"] * len(guess)
    unmatched: Counter[str] = Counter()
    for i, (g, a) in enumerate(zip(guess, answer, strict=True)):
        if g == a:
            results[i] = "correct"
        else:
            unmatched[a] += 1
    for i, g in enumerate(guess):
        if results[i] == "absent" and unmatched[g] > 0:
            results[i] = "present"
            unmatched[g] -= 1
    return results


def pattern(results: list[LetterResult]) -> str:
    """``G`` for correct, ``Y`` for present, ``-`` for absent.

    >>> pattern(["correct", "present", "absent", "absent", "correct"])
    'GY--G'
    """
    return "".join({"correct": "G", "present": "Y", "absent": "-"}[r] for r in results)


def _read(name: str) -> list[str]:
    return (_DATA / name).read_text(encoding="ascii").split()
