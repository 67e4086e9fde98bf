"""``openenv report``: a real run's results become one HTML page, opened in real Chromium."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from playwright.async_api import async_playwright
from typer.testing import CliRunner
from web_page_kit import keep_screenshot

from echo_env.models import EchoAction
from openenv import RunConfig, Runners, Task
from openenv.cli import app
from openenv.cli.run import write_results
from openenv.report import load_results, pass_at_k
from openenv.runtime import EpisodeSession

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
SCREENSHOT = Path(__file__).parents[1] / "docs" / "report.png"
CHARTS = ["rewards", "success", "lengths", "latency", "throughput", "passk"]


async def flaky(session: EpisodeSession) -> None:
    """Odd repeats of the `hard` tasks fail; everything else says a few words."""
    await session.reset()
    task_id = session.task.id
    if task_id.startswith("hard") and int(task_id.rsplit("#", 1)[1]) % 2:
        raise RuntimeError(f"gave up on {task_id}")
    for word in task_id.split("-"):
        await session.step(EchoAction(message=word))


@pytest.fixture(scope="module")
def results(echo_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    ids = [f"{group}-{n}#{r}" for group in ("easy", "hard") for n in range(5) for r in range(4)]
    tasks = [Task(id=i, env=echo_url, agent=flaky) for i in ids]
    outcome = Runners.sync_run_task(tasks, RunConfig(max_concurrency=8, retries=0))
    path = tmp_path_factory.mktemp("run") / "results.jsonl"
    write_results(outcome, path)
    return path


def test_pass_at_k_counts_tasks_played_several_times(results: Path) -> None:
    rows = load_results(results)
    assert len(rows) == 40
    # easy: always ok. hard: 2 of 4 tries ok, so pass@1 = 0.5 and pass@2 = 1 - C(2,2)/C(4,2).
    assert pass_at_k(rows, 1) == pytest.approx((10 * 1.0 + 10 * 0.5) / 20)
    assert pass_at_k(rows, 2) == pytest.approx((10 * 1.0 + 10 * (1 - 1 / 6)) / 20)


def test_the_report_opens_in_chromium_with_every_chart(results: Path) -> None:
    outcome = CliRunner().invoke(app, ["report", str(results)])
    assert outcome.exit_code == 0, outcome.output
    page_path = results.with_suffix(".html")
    assert outcome.output.strip() == f"report: {page_path}"
    text = page_path.read_text()
    # Self-contained: nothing to run, nothing to fetch (SVG namespaces are only names).
    assert "<script" not in text
    assert re.search(r'(src|href)="(https?:)?//', text) is None

    async def look() -> dict[str, object]:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=ARGS
            )
            page = await browser.new_page(viewport={"width": 1100, "height": 900})
            await page.goto(page_path.as_uri())
            found = {chart: await page.locator(f"#{chart} svg").count() for chart in CHARTS}
            errors = await page.locator("#errors tr").all_inner_texts()
            summary = await page.locator("#summary").inner_text()
            image = await page.screenshot(full_page=True)
            # Its charts plot this run's measured durations, which differ on every
            # run: only a change of layout is worth a new picture.
            await keep_screenshot(page, image, SCREENSHOT, tolerance=0.25)
            await browser.close()
            return {"charts": found, "errors": errors, "summary": summary}

    seen = asyncio.run(look())
    assert seen["charts"] == dict.fromkeys(CHARTS, 1)
    assert seen["errors"][1:] == ["RuntimeError\t10\tgave up on hard-0#1"]  # type: ignore[index]
    summary = str(seen["summary"])
    assert "40" in summary
    assert "30 / 10 / 0" in summary


def test_a_file_that_is_not_results_is_one_line_of_error(tmp_path: Path) -> None:
    bad = tmp_path / "notes.jsonl"
    bad.write_text(json.dumps({"task_id": "x", "status": "ok"}) + "\nnot json\n")
    outcome = CliRunner().invoke(app, ["report", str(bad)])
    assert outcome.exit_code == 1
    assert outcome.stderr.startswith(f"error: {bad}:2 is not JSON")


def test_the_report_of_a_run_killed_as_it_wrote_a_result_has_every_result_it_kept(
    tmp_path: Path,
) -> None:
    results = tmp_path / "killed.jsonl"
    kept = [{"task_id": f"t-{i}", "status": "ok", "reward": float(i), "steps": 2} for i in range(3)]
    cut = json.dumps({"task_id": "t-3", "status": "ok", "reward": 1.0})[:17]  # no newline
    results.write_text("".join(json.dumps(row) + "\n" for row in kept) + cut)
    outcome = CliRunner().invoke(app, ["report", str(results)])
    assert outcome.exit_code == 0, outcome.output
    assert load_results(results) == kept
    # A bad line that was written whole is no cut: it is still an error.
    results.write_text(results.read_text() + "\n")
    with pytest.raises(ValueError, match=re.escape("killed.jsonl:4 is not JSON")):
        load_results(results)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("[1, 2]", "a JSON list, not an object"),
        ('{"status": "ok"}', "it has no task_id"),
        ('{"task_id": "a", "reward": "high"}', 'its reward is "high", not a number'),
        ('{"task_id": "a", "steps": [3]}', "its steps is [3], not a number"),
        ('{"task_id": "a", "status": "error", "error": "boom"}', "its error is not an object"),
    ],
)
def test_a_line_that_is_json_but_not_a_result_is_one_line_of_error(
    tmp_path: Path, line: str, problem: str
) -> None:
    # Each used to end in a traceback (AttributeError, KeyError) or in a message
    # that named no line ("could not convert string to float: 'high'").
    bad = tmp_path / "results.jsonl"
    bad.write_text(json.dumps({"task_id": "x", "status": "ok"}) + "\n" + line + "\n")
    outcome = CliRunner().invoke(app, ["report", str(bad)])
    assert outcome.exit_code == 1
    assert outcome.stderr == f"error: {bad}:2 is not a result: {problem}\n"


def test_a_recording_given_for_results_is_named_as_such(echo_url: str, tmp_path: Path) -> None:
    # Both are JSON Lines that a run writes: an easy mix-up, once a KeyError.
    tasks = [Task(id="t0", env=echo_url, agent=flaky)]
    Runners.sync_run_task(tasks, RunConfig(record=str(tmp_path / "rec"), progress=False))
    (recording,) = (tmp_path / "rec").glob("runner-*.jsonl")
    outcome = CliRunner().invoke(app, ["report", str(recording)])
    assert outcome.exit_code == 1
    assert outcome.stderr == (
        f"error: {recording}:1 is not a result: it has no task_id "
        "(a recording: read it with openenv.trajectories.load)\n"
    )


def test_group_names_with_dollar_signs_are_drawn_as_written(tmp_path: Path) -> None:
    # Matplotlib took the text between two $ for TeX math: "$5-$10" was drawn in
    # math italics without its dollars, and "$\frac{$" failed the whole report.
    rows = [
        {"task_id": "a", "group": "under $5 and over $10", "status": "ok", "reward": 1.0},
        {"task_id": "b", "group": "$\\frac{$", "status": "ok", "reward": 1.0},
    ]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    outcome = CliRunner().invoke(app, ["report", str(results)])
    assert outcome.exit_code == 0, outcome.output
    page = (tmp_path / "results.html").read_text()
    success = page[page.index('<section id="success"') : page.index('<section id="lengths"')]
    # Plain labels use the upright font only; math text sets letters in italics.
    assert "DejaVuSans-" in success
    assert "Oblique" not in success


@pytest.mark.parametrize(
    ("rewards", "mean"),
    [
        ([1e17], "1e+17"),  # one value past float's 0.5 steps: NumPy could not bin it
        ([1e308, 1e308], "1e+308"),  # the sum is past the floats: fmean overflowed
        ([-1e308, 1e308], "0.000"),  # the range is past the floats
        ([0.0, 5e-324], "0.000"),  # a range too small for 20 bins
    ],
)
def test_rewards_at_the_ends_of_the_floats_are_drawn(
    tmp_path: Path, rewards: list[float], mean: str
) -> None:
    rows = [
        {"task_id": f"t-{i}", "status": "ok", "reward": reward, "steps": 1e300}
        for i, reward in enumerate(rewards)
    ]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    outcome = CliRunner().invoke(app, ["report", str(results)])
    assert outcome.exit_code == 0, outcome.output
    page = (tmp_path / "results.html").read_text()
    assert f"<div><b>{mean}</b><span>mean reward</span></div>" in page
    assert page.count("<svg") == 5
