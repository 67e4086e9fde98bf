"""OpenReward's HTTP session protocol: the JSON its SDK sends and expects.

The shapes here follow the ``openreward`` SDK (0.1.167): its client
(``openreward/api/environments/client.py``, ``api/_session/http.py``) and its
own server (``openreward/environments/server.py``, ``types.py``). openenv's
own wire format lives in ``openenv.protocol``; this is a foreign one, kept
apart so that neither leaks into the other. ``server/openreward.py`` serves it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, model_validator

from openenv.protocol import ErrorCode, json_text, reward_value
from openenv.tasks import TaskSpec
from openenv.tools import ImageContent, JsonContent, TextContent, ToolInfo, ToolOutput

__all__ = [
    "SESSION_HEADER",
    "CreateRequest",
    "SplitRequest",
    "TaskRangeRequest",
    "TaskRequest",
    "ToolCallRequest",
    "call_events",
    "prompt_blocks",
    "split_entry",
    "sse",
    "task_json",
    "tool_error_result",
    "tool_list",
    "tool_result",
]

logger = logging.getLogger("openenv.server")

SESSION_HEADER = "x-session-id"
DEPLOYMENT_HEADER = "x-deployment"
KEEPALIVE_SECONDS = 10.0  # an SSE comment while a call runs; the SDK gives up after 30 s
# The SDK reassembles an ``end`` event's data from the ``chunk`` events before it.
_CHUNK = 4096
# OpenReward's split types; any other split name is reported as a validation split.
_SPLIT_TYPES = frozenset({"train", "validation", "test"})


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateRequest(_Body):
    """``POST /create``: the task of the session, by spec or by split and index."""

    env_name: str | None = None
    task_spec: dict[str, Any] | None = None
    split: str | None = None
    index: int | None = None
    toolset_name: str | None = None

    @model_validator(mode="after")
    def _one_task_source(self) -> CreateRequest:
        has_spec = self.task_spec is not None
        has_index = self.split is not None and self.index is not None
        if has_spec == has_index or (self.split is None) != (self.index is None):
            raise ValueError("Provide either task_spec or both split and index, not both/neither")
        return self


class ToolCallRequest(_Body):
    """``POST /{env}/call``; ``task_id`` resumes a call whose stream broke."""

    name: str
    input: dict[str, Any]
    task_id: str | None = None


class SplitRequest(_Body):
    """``POST /{env}/tasks`` and ``/{env}/num_tasks``."""

    split: str


class TaskRequest(_Body):
    """``POST /{env}/task``."""

    split: str
    index: int


class TaskRangeRequest(_Body):
    """``POST /{env}/task_range``: Python's slice rules for ``start`` and ``stop``."""

    split: str
    start: int | None = None
    stop: int | None = None


def split_entry(name: str) -> dict[str, str]:
    """A split as ``GET /{env}/splits`` lists it.

    >>> split_entry("train"), split_entry("hard")
    ({'name': 'train', 'type': 'train'}, {'name': 'hard', 'type': 'validation'})
    """
    return {"name": name, "type": name if name in _SPLIT_TYPES else "validation"}


def task_json(task: Any) -> Any:
    """A task as JSON (an openenv ``TaskSpec``, or any JSON value an environment lists)."""
    if isinstance(task, BaseModel):
        return task.model_dump(mode="json")
    return TaskSpec.model_validate(task).model_dump(mode="json")


def tool_list(tools: Sequence[ToolInfo]) -> dict[str, Any]:
    """``GET /{env}/tools`` and ``/{env}/task_tools``: openenv tools have no terminal tool.

    >>> tool_list([ToolInfo(name="submit", description="End it.")])["tools"]
    [{'name': 'submit', 'description': 'End it.', 'input_schema': {'type': 'object'}}]
    """
    return {
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in tools
        ],
        "terminal_tool": None,
        "supports_score_group": False,
        "message_block_types": ["text", "image"],
    }


def prompt_blocks(prompt: str) -> list[dict[str, Any]]:
    """``GET /{env}/prompt``: the prompt as one text block."""
    return [{"type": "text", "text": prompt, "detail": None}]


def _block(block: TextContent | JsonContent | ImageContent) -> dict[str, Any]:
    if isinstance(block, TextContent):
        return {"type": "text", "text": block.text, "detail": None}
    if isinstance(block, JsonContent):
        # OpenReward's blocks are text or images: a JSON value travels as its text.
        text = json_text(block.data)
        return {"type": "text", "text": text, "detail": None}
    return {"type": "image", "data": block.data, "mimeType": block.mime_type, "detail": None}


def tool_result(output: ToolOutput) -> bytes:
    """A finished tool call, as the ``end`` event of ``/{env}/call`` carries it.

    >>> tool_result(ToolOutput.wrap({"value": 2}))
    b'{"ok":true,"output":{"blocks":[{"type":"text","text":"{\\\\"value\\\\":2}","detail":null}],"metadata":null,"reward":null,"finished":false}}'
    """
    return orjson.dumps(
        {
            "ok": True,
            "output": {
                "blocks": [_block(b) for b in output.content],
                "metadata": output.metadata or None,
                "reward": reward_value(output.reward),
                "finished": output.finished,
            },
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


# openenv's refusals of a tool call that the SDK reports as ToolCallError(reason).
TOOL_ERROR_REASONS = {
    ErrorCode.UNKNOWN_TOOL: "not_found",
    ErrorCode.VALIDATION_ERROR: "input_validation",
    ErrorCode.EPISODE_FINISHED: "episode_finished",
}


def tool_error_result(reason: str, message: str) -> bytes:
    """A refused tool call (the model's fault): ``ok`` false, the SDK's ``reason``."""
    return orjson.dumps({"ok": False, "error": message, "reason": reason})


def sse(event: str, data: bytes | str) -> bytes:
    """One server-sent event. Data with line breaks (an error's message; JSON text
    has none) goes as one ``data:`` line each, which clients join with ``\\n``:
    sent as it is, a line would end the event early, and the SDK's parser raises
    ``ValueError`` on a line without a colon.

    >>> sse("task_id", "abc")
    b'event: task_id\\r\\ndata: abc\\r\\n\\r\\n'
    >>> sse("error", "no such square:\\nz9")
    b'event: error\\r\\ndata: no such square:\\r\\ndata: z9\\r\\n\\r\\n'
    """
    raw = data.encode() if isinstance(data, str) else data
    lines = b"\r\ndata: ".join(_LINE_BREAK.split(raw))
    return b"event: " + event.encode() + b"\r\ndata: " + lines + b"\r\n\r\n"


_LINE_BREAK = re.compile(rb"\r\n|\r|\n")  # what ends a line of an event stream


def result_events(result: bytes) -> Iterator[bytes]:
    """A call's JSON result as ``chunk`` events and a last ``end`` event.

    Cut between characters, never inside one: the SDK decodes each line alone.

    >>> [e[:12] for e in result_events(b'"' + b'a' * 4095 + b'  b"')]
    [b'event: chunk', b'event: end\\r\\n']

    >>> list(result_events(b"{}"))
    [b'event: end\\r\\ndata: {}\\r\\n\\r\\n']
    """
    text = result.decode()
    start = 0
    while True:
        end = start + _CHUNK
        # The SDK strips a data line's leading blanks: no piece may start with one.
        while end < len(text) and text[end].isspace():
            end += 1
        if end >= len(text):
            yield sse("end", text[start:])
            return
        yield sse("chunk", text[start:end])
        start = end


async def call_events(
    task_id: str, running: asyncio.Task[tuple[str, bytes]] | None
) -> AsyncIterator[bytes]:
    """``/{env}/call``'s stream: ``task_id``, keepalives while the call runs, its result."""
    if running is None:
        yield sse("error", f"unknown task_id {task_id[:64]!r}")
        return
    yield sse("task_id", task_id)
    while not running.done():
        await asyncio.wait([running], timeout=KEEPALIVE_SECONDS)
        if not running.done():
            yield b": keepalive\r\n\r\n"
    try:
        event, data = running.result()
    except asyncio.CancelledError:  # a shutdown past its deadline gave up on the call
        event, data = "error", b"[SESSION_ERROR] the session has ended (shutdown)"
    except Exception as exc:  # a bug of ours, not the environment's: say so, briefly
        logger.exception("OpenReward tool call failed")
        event, data = "error", f"internal error: {type(exc).__name__}".encode()
    if event == "error":
        yield sse("error", data)
    else:
        for chunk in result_events(data):
            yield chunk
