"""Rubrics: parts combine as declared, each part is reported, failures are visible."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openenv import Gate, Max, Observation, Rubric, Sequential, TrajectoryRubric, WeightedSum


class Fixed(Rubric):
    def __init__(self, score: float) -> None:
        super().__init__()
        self.score = score
        self.calls = 0

    def forward(self, action: Any, observation: Any) -> float:
        self.calls += 1
        return self.score


class Broken(Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        raise ConnectionError("judge unreachable")


class Handshake(Rubric):
    """Two of these finish only if both run at once: each waits for the other."""

    def __init__(self, mine: asyncio.Event, theirs: asyncio.Event) -> None:
        super().__init__()
        self.mine, self.theirs = mine, theirs

    async def forward(self, action: Any, observation: Any) -> float:
        self.mine.set()
        await asyncio.wait_for(self.theirs.wait(), 5)
        return 1.0


def test_weighted_parts_sum_as_declared_and_each_part_is_reported() -> None:
    rubric = WeightedSum({"a": Fixed(1.0), "b": Fixed(0.5), "c": Fixed(0.0)}, weights=[2, 1, 3])
    observation = Observation()
    assert rubric(None, observation) == 2.5
    annotated = rubric.annotate(observation)
    assert annotated.reward == 2.5
    assert annotated.metadata["reward_parts"] == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert "reward_errors" not in annotated.metadata


def test_nested_parts_have_dotted_names() -> None:
    rubric = WeightedSum(
        {"quality": Max([Fixed(0.2), Fixed(0.7)]), "gate": Gate(Fixed(0.4), threshold=0.5)},
        weights={"quality": 1.0, "gate": 1.0},
    )
    assert rubric(None, None) == 0.7
    assert {name: part.last_score for name, part in rubric.parts()} == {
        "quality": 0.7,
        "quality.part0": 0.2,
        "quality.part1": 0.7,
        "gate": 0.0,
        "gate.part": 0.4,
    }


def test_a_part_that_raises_scores_zero_and_its_error_is_reported() -> None:
    rubric = WeightedSum({"ok": Fixed(1.0), "judge": Broken()}, weights=[0.5, 0.5])
    assert rubric(None, None) == 0.5
    observation = rubric.annotate(Observation())
    assert observation.reward == 0.5
    assert observation.metadata["reward_parts"] == {"ok": 1.0, "judge": 0.0}
    assert observation.metadata["reward_errors"] == {"judge": "ConnectionError: judge unreachable"}


def test_async_parts_run_concurrently() -> None:
    async def scenario() -> float:
        first, second = asyncio.Event(), asyncio.Event()
        rubric = WeightedSum([Handshake(first, second), Handshake(second, first)], weights=[1, 1])
        return await rubric.evaluate(None, None)

    assert asyncio.run(scenario()) == 2.0


def test_sequential_stops_at_the_first_zero() -> None:
    later = Fixed(1.0)
    assert Sequential(Fixed(1.0), Fixed(0.0), later)(None, None) == 0.0
    assert later.calls == 0  # never scored after the zero
    assert Sequential(Fixed(1.0), Fixed(0.6))(None, None) == 0.6


@pytest.mark.parametrize("scoring", ["call", "evaluate"])
def test_parts_a_sequential_skipped_report_no_score_rather_than_the_last_steps(
    scoring: str,
) -> None:
    # Step 1 scores every part; on step 2 the gate fails, and what the skipped
    # judge said on step 1 must not be reported as its score on step 2.
    gate, judge = Fixed(1.0), Fixed(0.9)
    rubric = Sequential(gate, WeightedSum({"judge": judge}, weights=[1.0]))

    def score() -> dict[str, float | None]:
        if scoring == "call":
            rubric(None, Observation())
        else:
            asyncio.run(rubric.evaluate(None, Observation()))
        parts: dict[str, float | None] = rubric.annotate(Observation()).metadata["reward_parts"]
        return parts

    assert score() == {"part0": 1.0, "part1": 0.9, "part1.judge": 0.9}
    gate.score = 0.0
    assert score() == {"part0": 0.0, "part1": None, "part1.judge": None}
    assert judge.calls == 1


def test_a_trajectory_rubric_scores_the_episode_when_it_ends() -> None:
    class Shortest(TrajectoryRubric):
        def score_trajectory(self, steps: list[tuple[Any, Any]]) -> float:
            return 1.0 / len(steps)

    rubric = Shortest()
    assert [rubric(n, Observation(done=n == 3)) for n in range(4)] == [0.0, 0.0, 0.0, 0.25]
    rubric.reset()
    assert rubric(0, Observation(done=True)) == 1.0


def test_plain_parts_score_on_a_running_loop_and_async_parts_say_how() -> None:
    async def scenario() -> None:
        assert WeightedSum([Fixed(1.0)], weights=[1])(None, None) == 1.0  # no await needed
        first, second = asyncio.Event(), asyncio.Event()
        with pytest.raises(RuntimeError, match=r"await rubric\.evaluate"):
            Handshake(first, second)(None, None)

    asyncio.run(scenario())


def test_mismatched_weights_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="2 parts but 3 weights"):
        WeightedSum([Fixed(1), Fixed(1)], weights=[1, 1, 1])
