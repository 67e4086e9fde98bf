"""Recorded sessions as episodes: load them, turn them into tables, replay them.

A server started with ``create_app(..., record=FOLDER)`` writes every
session's requests and replies there (see ``openenv.server.recording``).
``load(FOLDER)`` reads them back as ``Episode``s, one per ``reset``, with
every step in order; ``to_rows`` flattens them into one dict per step (what
``datasets.Dataset.from_list`` takes) and ``to_parquet`` writes the same
rows with pyarrow; ``replay`` sends an episode's frames to a server again and
says which replies differ, which checks that the environment is
deterministic (same seed, same actions, same observations).

>>> rows = to_rows([Episode("s1", 0, [Step("reset", {"seed": 1}, {"type": "observation",
...     "data": {"observation": {"n": 0}, "reward": None, "done": False}}, 0.0, 0.1)])])
>>> rows[0]["kind"], rows[0]["observation"], rows[0]["done"]
('reset', '{"n":0}', False)
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import orjson
from pydantic import BeforeValidator

from openenv.protocol import reward_from

__all__ = ["Episode", "RecordFolder", "Step", "load", "replay", "to_parquet", "to_rows"]


def _as_text(given: object) -> object:
    return os.fspath(given) if isinstance(given, os.PathLike) else given


# A folder to record into (a server's ``record=``, a run's ``RunConfig(record=)``),
# named by a ``str`` or a ``pathlib.Path`` (pytest's ``tmp_path / "runs"``), kept as text.
RecordFolder = Annotated[str, BeforeValidator(_as_text)]


def embedded_frame(frame: str | bytes | Any) -> Any:
    """A frame as a recording line holds it: JSON text verbatim, on one line.

    Both writers (the server's and ``Runners``') embed what crossed the wire
    with this, so a frame from a peer that pretty-prints or sends no JSON at
    all cannot split or break the line its event is written on."""
    if not isinstance(frame, str | bytes):
        return frame
    try:
        value = orjson.loads(frame)  # only well-formed JSON may be embedded as is
    except orjson.JSONDecodeError:
        return {"invalid_frame": frame[:200] if isinstance(frame, str) else repr(frame[:200])}
    # A line break in JSON text is whitespace between tokens (in a string it is
    # escaped): a client's pretty-printed frame, or a trailing newline. Embedded
    # as is, it would split the event over several lines of the file.
    if isinstance(frame, bytes):
        spans_lines = b"\n" in frame or b"\r" in frame
    else:
        spans_lines = "\n" in frame or "\r" in frame
    if spans_lines:
        return value  # the same JSON, encoded again on one line
    return orjson.Fragment(frame)


# The largest reply frame ``replay`` takes, in bytes: what the sync and
# multiplexing clients take, so what they recorded can be replayed.
_REPLY_LIMIT = 2**26


@dataclass
class Step:
    """One request of a session and the server's reply."""

    kind: str  # reset, step, call_tool, state, ...
    request: Any  # the request's data (a reset's arguments, an action, a tool call)
    reply: dict[str, Any]  # the reply frame: {"type": ..., "data": ...}
    started: float
    ended: float

    @property
    def error(self) -> dict[str, Any] | None:
        return self.reply.get("data") if self.reply.get("type") == "error" else None

    @property
    def observation(self) -> Any:
        data = self.reply.get("data") or {}
        return data.get("observation") if self.reply.get("type") == "observation" else data

    @property
    def reward(self) -> float | None:
        data = self.reply.get("data") or {}
        reward = reward_from(data.get("reward")) if isinstance(data, dict) else None
        return float(reward) if isinstance(reward, int | float) else None

    @property
    def done(self) -> bool:
        data = self.reply.get("data") or {}
        return bool(data.get("done") or data.get("finished")) if isinstance(data, dict) else False


@dataclass
class Episode:
    """The steps of one session from one ``reset`` to the next (or to its end)."""

    session: str
    index: int  # the episode's number within its session
    steps: list[Step] = field(default_factory=list)
    # How it ended: "reset" (the session's next reset began another), the reason
    # its session was closed with ("ok", "disconnect", "TimeoutError", ...), or
    # None when the recording has no end for it: its process was killed, or its
    # session was still open.
    ended: str | None = None

    @property
    def total_reward(self) -> float:
        """The sum of its steps' rewards; a reset's does not count."""
        return sum(step.reward or 0.0 for step in self.steps if step.kind != "reset")


def load(path: str | Path) -> list[Episode]:
    """Every episode in a recording file, or in every ``*.jsonl`` of a folder.

    Lines that are not JSON objects (the last line of a killed process, say) are
    skipped, with a warning that counts them. An episode's ``ended`` says how it
    ended; ``None`` where the recording does not say (a killed process).
    """
    root = Path(path)
    files = sorted(root.glob("*.jsonl")) if root.is_dir() else [root]
    episodes: list[Episode] = []
    counts: Counter[Any] = Counter()  # episodes so far per session id, in every file
    unreadable: Counter[str] = Counter()
    for file in files:
        # A session lives in one file, and its id may come again in another (a
        # runner's session is its task's id, and a second run may record into the
        # same folder): an episode ends with its own session's close, in its file.
        current: dict[Any, Episode] = {}
        for line in file.read_bytes().splitlines():
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                event = None  # a line cut short by a kill, say
            if not isinstance(event, dict):
                unreadable[file.name] += 1
                continue
            session: Any = event.get("session")
            if event.get("event") in ("opened", "closed"):
                ending = current.pop(session, None)
                if ending is not None and event.get("event") == "closed":
                    ending.ended = str(event.get("reason"))
                continue
            if event.get("event") != "call":
                continue
            request, reply = event["request"], event["reply"] or {}
            if not isinstance(request, dict) or "invalid_frame" in request:
                kind, data = "invalid", request  # not a JSON object: refused by the server
            else:
                kind, data = str(request.get("type", "")), request.get("data")
            step = Step(kind, data, reply, float(event["started"]), float(event["ended"]))
            episode = current.get(session)
            if kind == "reset" or episode is None:
                if episode is not None:
                    episode.ended = "reset"
                episode = current[session] = Episode(session, counts[session])
                counts[session] += 1
                episodes.append(episode)
            episode.steps.append(step)
    if unreadable:
        where = ", ".join(f"{name} ({n})" for name, n in unreadable.items())
        warnings.warn(f"skipped lines that are not JSON objects: {where}", stacklevel=2)
    episodes.sort(key=lambda e: (e.steps[0].started, e.session, e.index))
    return episodes


def to_rows(episodes: Iterable[Episode]) -> list[dict[str, Any]]:
    """One flat row per step; nested values as JSON text, so every column has one type."""
    rows = []
    for episode in episodes:
        for number, step in enumerate(episode.steps):
            error = step.error
            rows.append(
                {
                    "session": episode.session,
                    "episode": episode.index,
                    "step": number,
                    "kind": step.kind,
                    "request": _json(step.request),
                    "observation": _json(step.observation),
                    "reward": step.reward,
                    "done": step.done,
                    "error": None
                    if error is None
                    else f"{error.get('code')}: {error.get('message')}",
                    "started": step.started,
                    "ended": step.ended,
                }
            )
    return rows


def to_parquet(episodes: Iterable[Episode], path: str | Path) -> Path:
    """Write ``to_rows`` as a Parquet file (needs pyarrow: the ``parquet`` extra)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    target = Path(path)
    pq.write_table(pa.Table.from_pylist(to_rows(episodes)), target)
    return target


async def replay(
    episode: Episode, url: str, *, api_key: str | None = None, timeout: float = 60.0
) -> list[int]:
    """Send the episode's requests to ``url`` again; the numbers of the steps whose reply differs.

    ``[]`` means the server answered exactly as recorded.
    """
    from websockets.asyncio.client import connect

    from openenv.client import ws_url

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    differ = []
    # Replies as large as openenv's clients take (websockets' own limit is 1 MiB).
    async with connect(
        ws_url(url), additional_headers=headers, compression=None, max_size=_REPLY_LIMIT
    ) as ws:
        for number, step in enumerate(episode.steps):
            if step.kind == "invalid":
                await ws.send(_invalid_frame(step.request))
            else:
                frame: dict[str, Any] = {"type": step.kind}
                if step.request is not None:
                    frame["data"] = step.request
                await ws.send(orjson.dumps(frame).decode())
            async with asyncio.timeout(timeout):
                reply = orjson.loads(await ws.recv())
            if _comparable(reply) != _comparable(step.reply):
                differ.append(number)
    return differ


def _invalid_frame(request: Any) -> str:
    """The text of a frame the server refused as not a JSON object."""
    if isinstance(request, dict):
        return str(request.get("invalid_frame", ""))  # it was not JSON: kept as text
    return orjson.dumps(request).decode()  # JSON, but a list, a string, a number, null


def _comparable(reply: dict[str, Any]) -> Any:
    reply = {k: v for k, v in reply.items() if k != "id"}
    data = reply.get("data")
    if reply.get("type") == "observation" and isinstance(data, dict):
        fields = data.get("observation")
        # A non-empty metadata travels beside the fields and among them (as OpenEnv's
        # server sends it); recordings made before the latter have it beside them
        # only. The same reply either way: a replay must not call it different.
        if isinstance(fields, dict) and fields.get("metadata") == data.get("metadata", {}):
            fields = {k: v for k, v in fields.items() if k != "metadata"}
            reply["data"] = {**data, "observation": fields}
    return reply


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def replay_all(episodes: Sequence[Episode], url: str, **options: Any) -> dict[str, list[int]]:
    """``replay`` every episode from plain code: ``{"session/episode": differing steps}``."""

    async def run() -> dict[str, list[int]]:
        return {f"{e.session}/{e.index}": await replay(e, url, **options) for e in episodes}

    return asyncio.run(run())
