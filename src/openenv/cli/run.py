"""``openenv run``: play many episodes against an environment server, on any engine."""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from openenv.cli.errors import fail
from openenv.client import ServerPool
from openenv.errors import EngineError
from openenv.protocol import reward_value
from openenv.runtime import EngineName, RandomAgent, RunConfig, Runners, Task, TaskResult

__all__ = ["RANDOM_MAX_STEPS", "load_agent", "render_summary", "run", "write_results"]

# RandomAgent never stops by itself: in an environment only a choice ends (a
# tool such as counter_env's submit), its episodes would never end.
RANDOM_MAX_STEPS = 1000


def load_agent(spec: str) -> Any:
    """Import ``module:attribute``; a class is instantiated with no arguments.

    >>> type(load_agent("openenv.runtime:RandomAgent")).__name__
    'RandomAgent'
    >>> load_agent("openenv.runtime:NoSuchAgent")
    Traceback (most recent call last):
    ...
    ValueError: module 'openenv.runtime' has no attribute 'NoSuchAgent'
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--agent takes module:attribute (e.g. my_agents:play), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`, find modules in this folder
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        # Only a missing module itself is "not found"; a broken import inside it is its own error.
        if exc.name is None or not module_name.startswith(exc.name):
            raise
        raise ValueError(f"cannot import module {module_name!r}: {exc}") from None
    obj: Any = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj() if isinstance(obj, type) else obj


def _agent(spec: str) -> Any:
    """``load_agent``, with whatever the agent's own module raised said in one line."""
    try:
        return load_agent(spec)
    except ValueError:
        raise
    # The user's code: its file, line and error, not a traceback; a sys.exit() in it
    # (a script's usage check) must not end this process as if the run had gone well.
    except (Exception, SystemExit) as exc:
        where = ""
        if isinstance(exc, SyntaxError) and exc.filename:
            where = f"{Path(exc.filename).name}:{exc.lineno}: "
        elif frames := traceback.extract_tb(exc.__traceback__):
            where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}: "
        text = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        lines = text.strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        raise ValueError(f"--agent {spec}: {where}{reason}") from None


def run(
    env: Annotated[
        list[str],
        typer.Option(
            "--env",
            help="The environment server's URL. Repeat it (or join URLs with commas) to "
            "spread sessions over several servers or name a fleet's directory.",
        ),
    ],
    agent: Annotated[
        str | None,
        typer.Option(help="The agent, as module:attribute. Default: RandomAgent."),
    ] = None,
    tasks: Annotated[int, typer.Option(min=1, help="Episodes to play.")] = 10,
    engine: Annotated[EngineName, typer.Option(help="Where to run them.")] = EngineName.LOCAL,
    workers: Annotated[
        int, typer.Option(min=1, help="Worker processes, Ray actors or Spark jobs.")
    ] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes in flight per worker.")] = 64,
    max_steps: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Step budget of an act() agent's episode (default: "
            f"{RANDOM_MAX_STEPS:,} for the default RandomAgent, none for an --agent).",
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(min=0.001, help="Seconds each episode may take.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Episode i is reset with seed + i.")] = 0,
    in_local: Annotated[
        bool, typer.Option(help="Run Ray or Spark as a local cluster on this machine.")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Write every result to this file, as JSON Lines, each the moment it is in."
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="Keep the results already in --out and play only the tasks missing there "
            "(run again with the same --tasks and --seed after an interrupted run)."
        ),
    ] = False,
    record: Annotated[
        Path | None,
        typer.Option(
            help="Record every episode, step by step, as JSON Lines in this folder "
            "(read it with openenv.trajectories.load)."
        ),
    ] = None,
    progress: Annotated[
        bool | None, typer.Option(help="Show progress (default: on a terminal).")
    ] = None,
) -> None:
    """Play many episodes against an environment server and summarise them.

    Exits 0 when every episode ended well, 1 when one ended in an error or a
    timeout, and 2 when the run could not start (a bad option, an agent that
    does not load, a results file it cannot write).
    """
    console = Console()
    try:
        player = _agent(agent) if agent else RandomAgent(seed=seed)
        if agent is None and max_steps is None:
            max_steps = RANDOM_MAX_STEPS
        joined = ",".join(env)
        where: str | ServerPool = ServerPool(joined) if "," in joined else joined
        batch = [
            Task(id=f"task-{i}", env=where, agent=player, seed=seed + i, max_steps=max_steps)
            for i in range(tasks)
        ]
        config = RunConfig(
            engine_name=engine,
            worker_num=workers,
            max_concurrency=concurrency,
            timeout=timeout,
            in_local=in_local,
            progress=progress,
            record=None if record is None else str(record),
        )
        if resume and out is None:
            raise ValueError("--resume needs --out, the file of the results to keep")
        kept = _resume(out) if resume and out is not None else {}
        todo = [task for task in batch if task.id not in kept]
        if kept:
            console.print(f"resuming: {len(batch) - len(todo)} of {len(batch)} tasks done in {out}")
        started = time.perf_counter()
        fresh = _play(todo, config, out, append=resume)
        elapsed = time.perf_counter() - started
    except (ValueError, TypeError, EngineError) as exc:
        fail(exc, 2)
    results = [fresh[t.id] if t.id in fresh else kept[t.id] for t in batch]
    if out is not None:  # complete: the same lines, now in task order
        # Resumed with fewer --tasks: the results of tasks past them stay, after these.
        ids = {t.id for t in batch}
        others = [r for task_id, r in kept.items() if task_id not in ids]
        staged = out.with_name(f".{out.name}.partial")
        write_results(results + others, staged)
        os.replace(staged, out)
    render_summary(results, elapsed, console)
    if out is not None:
        _report(out, console)
    if any(not r.ok for r in results):
        raise typer.Exit(1)


def _report(results: Path, console: Console) -> None:
    try:
        from openenv.report import write_report
    except ImportError:  # matplotlib is an extra
        console.print(f"report: openenv report {results} (needs openenv-scale[report])")
        return
    console.print(f"report: {write_report(results)}")


def write_results(results: list[TaskResult], path: Path) -> None:
    """One JSON object per line: NaN and ±inf as ``"NaN"``, ``"Infinity"`` and
    ``"-Infinity"`` (as frames write them), other values JSON cannot hold as their repr."""
    with path.open("wb") as file:
        for result in results:
            file.write(_line(result))


# NumPy scalars and arrays as numbers and lists, dict keys such as 1 as "1".
_JSON = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE


def _line(result: TaskResult) -> bytes:
    data = result.to_dict()
    data["value"] = _non_finite_as_text(data["value"])
    try:
        return orjson.dumps(data, default=repr, option=_JSON)
    except TypeError:
        # A value orjson refuses even with repr to fall back on (an int past 64
        # bits, a tuple key): the whole value as its repr, not a run that ends
        # with its results unwritten.
        data["value"] = repr(result.value)
        return orjson.dumps(data, default=repr, option=_JSON)


def _non_finite_as_text(value: Any) -> Any:
    """``value`` with its NaN and ±inf floats (in lists, tuples, dicts and NumPy
    arrays too) as text, which orjson would write as ``null``, taken for no
    value at all; anything else as it is.

    >>> _non_finite_as_text({"loss": float("nan"), "bounds": (float("-inf"), 1.5), "n": 2})
    {'loss': 'NaN', 'bounds': ['-Infinity', 1.5], 'n': 2}
    """
    if isinstance(value, float):  # NumPy's float64 too
        return reward_value(float(value))
    if isinstance(value, dict):
        return {key: _non_finite_as_text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_non_finite_as_text(item) for item in value]
    if getattr(getattr(value, "dtype", None), "kind", None) == "f":  # a NumPy array or scalar
        return _non_finite_as_text(value.tolist())
    return value


def _play(
    tasks: list[Task], config: RunConfig, out: Path | None, *, append: bool
) -> dict[str, TaskResult]:
    """Run the tasks; with ``out``, write each result there the moment it is in."""
    if out is None:
        return {r.task_id: r for r in Runners.sync_run_task(tasks, config)}
    results: dict[str, TaskResult] = {}
    try:
        file = out.open("ab" if append else "wb")
    except OSError as exc:
        raise ValueError(f"cannot write --out {out}: {exc.strerror or exc}") from None
    with file:
        for result in Runners.sync_stream(tasks, config):
            file.write(_line(result))
            file.flush()  # a run killed now keeps every result it had
            results[result.task_id] = result
    return results


def _resume(path: Path) -> dict[str, TaskResult]:
    """The results already in ``path``; a line cut short by a kill is dropped from the file."""
    if not path.exists():
        return {}
    try:
        data = path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            with path.open("r+b") as file:
                file.truncate(len(complete))
    except OSError as exc:
        raise ValueError(f"cannot resume from --out {path}: {exc.strerror or exc}") from None
    kept: dict[str, TaskResult] = {}
    for number, line in enumerate(complete.splitlines(), 1):
        if line.strip():
            try:
                result = TaskResult.from_dict(orjson.loads(line))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise ValueError(
                    f"cannot resume from --out {path}: line {number} is not a result of "
                    f"openenv run ({type(exc).__name__}: {exc})"
                ) from None
            kept[result.task_id] = result
    return kept


def render_summary(results: list[TaskResult], elapsed: float, console: Console) -> None:
    statuses = Counter(r.status.value for r in results)
    errors = Counter(r.error.type for r in results if r.error is not None)
    steps = sum(r.steps for r in results)
    table = Table(title="openenv run", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row(
        "episodes",
        f"{len(results)} ({statuses['ok']} ok, {statuses['error']} error, "
        f"{statuses['timeout']} timeout)",
    )
    table.add_row("steps", f"{steps:,}")
    table.add_row("mean reward", f"{sum(r.reward for r in results) / len(results):.3f}")
    table.add_row("wall time", f"{elapsed:.2f} s")
    table.add_row("episodes/s", f"{len(results) / elapsed:,.1f}" if elapsed else "-")
    table.add_row("errors", ", ".join(f"{k}: {n}" for k, n in errors.most_common()) or "none")
    console.print(table)
    first: dict[str, str] = {}
    for result in results:
        if result.error is not None and result.error.message:
            first.setdefault(result.error.type, result.error.message)
    for kind, message in first.items():  # what each kind of error said, once
        console.print(f"  [dim]{kind}: {message}[/]", highlight=False)
