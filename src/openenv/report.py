"""``openenv report``: one self-contained HTML page about a run's results.

It reads the JSON Lines that ``openenv run --out`` (or ``write_results``)
writes, one ``TaskResult`` per line, and draws with matplotlib into inline
SVG: no CDN, no script, one file to attach to a pull request or a paper.

Groups: a result's ``group`` key when it has one, else its task id up to the
first ``-`` or ``/`` (``train-0003`` is in ``train``). Repeats: ids that differ
only after a ``#`` (``train-0003#1``, ``train-0003#2``) are one task played
several times, which gives pass@k.

>>> rows = [{"task_id": "a-1#0", "status": "ok", "reward": 1.0, "steps": 3},
...         {"task_id": "a-1#1", "status": "error", "reward": 0.0, "steps": 1}]
>>> pass_at_k(rows, 1), pass_at_k(rows, 2)
(0.5, 1.0)
"""

from __future__ import annotations

import collections
import html
import io
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from matplotlib.figure import Figure  # the `report` extra; ImportError names it

from openenv.protocol import reward_from

__all__ = ["load_results", "pass_at_k", "render_report", "write_report"]

_PALETTE = ("#3b6ea5", "#e07b39", "#5a9e5a", "#c44e52", "#8172b2")


def load_results(path: str | Path) -> list[dict[str, Any]]:
    """Every result in a JSON Lines file (blank lines skipped).

    A last line without its newline that is not JSON was cut short by a run
    killed as it wrote it: it is left out, as ``openenv run --resume`` leaves
    it out, so the report of a killed run shows every result it kept.

    Raises:
        ValueError: A line is not JSON, or not a result (a JSON object with a
            ``task_id``, and numbers or null where the report reads numbers).
    """
    rows = []
    data = Path(path).read_bytes()
    lines = data.splitlines()
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                if number == len(lines) and not data.endswith(b"\n"):
                    break  # cut short
                raise ValueError(f"{path}:{number} is not JSON: {exc}") from None
            if type(row) is dict and "reward" in row:  # a NaN total is written "NaN"
                row["reward"] = reward_from(row["reward"])
            problem = _not_a_result(row)
            if problem is not None:
                raise ValueError(f"{path}:{number} is not a result: {problem}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no results")
    return rows


def _not_a_result(row: Any) -> str | None:
    """What keeps ``row`` from being a result the report can draw (``None``: nothing)."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    if "task_id" not in row:
        if "session" in row and "event" in row:
            return "it has no task_id (a recording: read it with openenv.trajectories.load)"
        return "it has no task_id"
    for key in ("reward", "steps", "started_at", "ended_at"):
        value = row.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"its {key} is {orjson.dumps(value).decode()[:40]}, not a number"
    if row.get("error") is not None and not isinstance(row["error"], dict):
        return "its error is not an object"
    return None


def group_of(row: dict[str, Any]) -> str:
    return str(row.get("group") or re.split(r"[-/]", _base(row), maxsplit=1)[0])


def _base(row: dict[str, Any]) -> str:
    return str(row["task_id"]).split("#", 1)[0]


def pass_at_k(rows: Sequence[dict[str, Any]], k: int) -> float:
    """The unbiased pass@k over tasks played n >= k times (Chen et al., 2021)."""
    tries: dict[str, list[bool]] = collections.defaultdict(list)
    for row in rows:
        tries[_base(row)].append(row.get("status") == "ok" and (row.get("reward") or 0) > 0)
    estimates = []
    for outcomes in tries.values():
        n, c = len(outcomes), sum(outcomes)
        if n >= k:
            estimates.append(1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k))
    return statistics.fmean(estimates) if estimates else float("nan")


def render_report(rows: Sequence[dict[str, Any]], title: str = "openenv run") -> str:
    """The report as one HTML document."""
    sections = [
        _summary(rows),
        _chart("rewards", "Reward per episode", _reward_histogram(rows)),
        _chart("success", "Success rate by group", _success_by_group(rows)),
        _chart("lengths", "Episode length (steps)", _length_histogram(rows)),
        _chart("latency", "Time per step, by episode", _step_latency(rows)),
        _chart("throughput", "Episodes finished per second", _throughput(rows)),
    ]
    if max(collections.Counter(_base(r) for r in rows).values()) > 1:
        sections.append(_chart("passk", "pass@k (tasks played several times)", _pass_curve(rows)))
    sections.append(_errors(rows))
    body = "\n".join(sections)
    return _PAGE.format(title=html.escape(title), body=body)


def write_report(results: str | Path, out: str | Path | None = None) -> Path:
    """Read ``results`` (JSON Lines) and write the HTML report beside it (or to ``out``)."""
    rows = load_results(results)
    target = Path(out) if out is not None else Path(results).with_suffix(".html")
    target.write_text(render_report(rows, title=f"openenv run: {Path(results).name}"))
    return target


# -- sections ---------------------------------------------------------------


def _summary(rows: Sequence[dict[str, Any]]) -> str:
    statuses = collections.Counter(r.get("status") for r in rows)
    rewards = _rewards(rows)
    span = _span(rows)
    cells = [
        ("episodes", f"{len(rows):,}"),
        ("ok / error / timeout", f"{statuses['ok']} / {statuses['error']} / {statuses['timeout']}"),
        ("success rate", f"{statuses['ok'] / len(rows):.1%}"),
        ("mean reward", _number(_mean(rewards)) if rewards else "-"),
        *(
            [("rewards NaN or infinite", f"{len(rows) - len(rewards):,}")]
            if len(rewards) < len(rows)
            else []
        ),
        ("steps", f"{sum(int(r.get('steps') or 0) for r in rows):,}"),
        ("wall time", f"{span:.2f} s" if span else "-"),
    ]
    items = "".join(f"<div><b>{html.escape(v)}</b><span>{k}</span></div>" for k, v in cells)
    return f'<section id="summary" class="summary">{items}</section>'


def _chart(key: str, heading: str, svg: str) -> str:
    return f'<section id="{key}" class="chart"><h2>{heading}</h2>{svg}</section>'


def _errors(rows: Sequence[dict[str, Any]]) -> str:
    kinds: collections.Counter[str] = collections.Counter()
    first: dict[str, str] = {}
    for row in rows:
        error = row.get("error") or {}
        if error:
            kind = str(error.get("type", "error"))
            kinds[kind] += 1
            first.setdefault(kind, str(error.get("message", "")))
    if not kinds:
        table = "<p>No errors.</p>"
    else:
        lines = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{n:,}</td><td>{html.escape(first[k])}</td></tr>"
            for k, n in kinds.most_common()
        )
        table = f"<table><tr><th>kind</th><th>count</th><th>first message</th></tr>{lines}</table>"
    return f'<section id="errors"><h2>Errors</h2>{table}</section>'


# -- charts -----------------------------------------------------------------


def _figure() -> Any:
    # A bare Figure, not pyplot: no backend is chosen, no global state is touched.
    figure = Figure(figsize=(6.4, 3.0), layout="constrained")
    return figure, figure.add_subplot()


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # inline: drop the XML prolog and doctype


def _reward_histogram(rows: Sequence[dict[str, Any]]) -> str:
    figure, axes = _figure()
    _histogram(axes, _rewards(rows), 20, _PALETTE[0])
    axes.set_xlabel("total reward")
    axes.set_ylabel("episodes")
    return _svg(figure)


def _histogram(axes: Any, values: Sequence[float], bins: int, color: str) -> None:
    """``axes.hist``, or a bar per value where the values' range cannot be cut into bins.

    NumPy cannot bin values as far apart as ``-1e308`` and ``1e308`` (their
    range is past the floats), nor one value so large that ``x + 0.5 == x``
    (a lone reward of ``1e17``): it raises.
    """
    if not values or math.isfinite(max(values) - min(values)):
        try:
            axes.hist(values, bins=bins, color=color)
            return
        except ValueError:  # "Too many bins for data range"
            pass
    counts = collections.Counter(values).most_common(bins)
    axes.bar([f"{value:.6g}" for value, _ in counts], [n for _, n in counts], color=color)


def _number(value: float) -> str:
    """Three decimals, or four significant digits for a number too long for its card.

    >>> _number(0.5), _number(-2e300)
    ('0.500', '-2e+300')
    """
    return f"{value:.3f}" if abs(value) < 1e9 else f"{value:.4g}"


def _mean(values: Sequence[float]) -> float:
    """The mean of finite values, without overflow when their sum is past the floats.

    >>> _mean([1e308, 1e308]), _mean([1.0, 2.0])
    (1e+308, 1.5)
    """
    return math.fsum(value / len(values) for value in values)


def _rewards(rows: Sequence[dict[str, Any]]) -> list[float]:
    """The finite rewards (a missing one is 0); a NaN or infinite one is counted apart."""
    rewards = (float(r.get("reward") or 0) for r in rows)
    return [reward for reward in rewards if math.isfinite(reward)]


def _success_by_group(rows: Sequence[dict[str, Any]]) -> str:
    groups: dict[str, list[bool]] = collections.defaultdict(list)
    for row in rows:
        groups[group_of(row)].append(row.get("status") == "ok")
    names = sorted(groups)
    figure, axes = _figure()
    # Matplotlib reads text between two $ as TeX math: a group "$5-$10" would lose
    # its dollars, and one like "$\\frac{$" would fail the whole report.
    labels = [name.replace("$", r"\$") for name in names]
    axes.bar(labels, [statistics.fmean(groups[n]) for n in names], color=_PALETTE[2])
    axes.set_ylim(0, 1)
    axes.set_ylabel("ok")
    return _svg(figure)


def _length_histogram(rows: Sequence[dict[str, Any]]) -> str:
    figure, axes = _figure()
    _histogram(axes, [float(r.get("steps") or 0) for r in rows], 20, _PALETTE[1])
    axes.set_xlabel("steps")
    axes.set_ylabel("episodes")
    return _svg(figure)


def _step_latency(rows: Sequence[dict[str, Any]]) -> str:
    per_step = sorted(
        1000 * (r["ended_at"] - r["started_at"]) / r["steps"]
        for r in rows
        if r.get("steps") and r.get("ended_at") and r.get("started_at")
    )
    figure, axes = _figure()
    if per_step:
        _histogram(axes, per_step, 30, _PALETTE[4])
        for q, style in ((50, "-"), (90, "--"), (99, ":")):
            value = per_step[min(len(per_step) - 1, int(len(per_step) * q / 100))]
            axes.axvline(value, color="black", linestyle=style, label=f"p{q} {value:.1f} ms")
        axes.legend()
    axes.set_xlabel("episode wall time / steps (ms)")
    axes.set_ylabel("episodes")
    return _svg(figure)


def _throughput(rows: Sequence[dict[str, Any]]) -> str:
    ends = sorted(float(r["ended_at"]) for r in rows if r.get("ended_at"))
    figure, axes = _figure()
    if ends:
        start = min(float(r.get("started_at") or ends[0]) for r in rows)
        width = max((ends[-1] - start) / 40, 1e-3)
        bins = collections.Counter(int((end - start) / width) for end in ends)
        xs = list(range(max(bins) + 1))
        axes.plot([x * width for x in xs], [bins[x] / width for x in xs], color=_PALETTE[0])
    axes.set_xlabel("seconds since the run started")
    axes.set_ylabel("episodes / s")
    return _svg(figure)


def _pass_curve(rows: Sequence[dict[str, Any]]) -> str:
    most = max(collections.Counter(_base(r) for r in rows).values())
    ks = list(range(1, most + 1))
    figure, axes = _figure()
    axes.plot(ks, [pass_at_k(rows, k) for k in ks], marker="o", color=_PALETTE[3])
    axes.set_xlabel("k")
    axes.set_ylabel("pass@k")
    axes.set_ylim(0, 1)
    return _svg(figure)


def _span(rows: Sequence[dict[str, Any]]) -> float:
    starts = [float(r["started_at"]) for r in rows if r.get("started_at")]
    ends = [float(r["ended_at"]) for r in rows if r.get("ended_at")]
    return max(ends) - min(starts) if starts and ends else 0.0


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; color: #222; }}
.summary {{ display: grid; grid-template-columns: repeat(3, 1fr); gap: 0.5rem; }}
.summary div {{ background: #f3f5f8; padding: 0.6rem 0.8rem; border-radius: 6px; }}
.summary b {{ display: block; font-size: 1.3rem; }}
.summary span {{ color: #666; }}
.chart svg {{ width: 100%; height: auto; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 0.3rem 0.5rem; text-align: left; }}
</style></head>
<body><h1>{title}</h1>
{body}
</body></html>
"""
