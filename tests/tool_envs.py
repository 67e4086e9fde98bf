"""A small tool-calling environment for tests, with tasks in two splits."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel
from servers import Ping, Pong

from openenv import (
    Environment,
    ImageContent,
    State,
    TaskSpec,
    TextContent,
    ToolOutput,
    tool,
)

# One HTTP client for every test: creating one loads the CA bundle (~0.2 s).
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


class Puzzle(TaskSpec):
    answer: int
    prompt: str = ""


SPLITS: dict[str, list[Puzzle]] = {
    "train": [Puzzle(id=f"p{i}", answer=i, prompt=f"say {i}") for i in range(25)],
    "test": [Puzzle(id="q0", answer=42, prompt="say 42")],
}


class Note(BaseModel):
    title: str
    body: str = ""


class ToolBox(Environment[Ping, Pong, State]):
    """Tools of every kind: sync, async, model arguments, failing, finishing."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State()
        self.task: Puzzle | None = None
        self.notes: list[Note] = []

    @classmethod
    def list_splits(cls) -> Sequence[str]:
        return list(SPLITS)

    @classmethod
    def list_tasks(cls, split: str) -> Sequence[Puzzle]:
        return SPLITS[split]

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, task: Puzzle | None = None
    ) -> Pong:
        self._state = State(episode_id=episode_id)
        self.task = task
        kind = type(task).__name__ if task is not None else "none"
        return Pong(message=f"task:{task.id if task else None}:{kind}")

    def step(self, action: Ping, **kwargs: Any) -> Pong:
        self._state.step_count += 1
        return Pong(message=action.message, count=self._state.step_count)

    @property
    def state(self) -> State:
        return self._state

    @tool
    def add(self, a: int, b: int = 2) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number,
                two unless given.
        """
        return a + b

    @tool
    async def shout(self, text: str) -> str:
        """Say it louder."""
        return text.upper()

    @tool
    def where_sync(self) -> str:
        """Name the thread a plain def tool runs in."""
        return threading.current_thread().name

    @tool
    async def where_async(self) -> str:
        """Name the thread an async def tool runs in."""
        return threading.current_thread().name

    @tool
    def save(self, note: Note) -> dict[str, Any]:
        """Keep a note (the arguments are a pydantic model)."""
        self.notes.append(note)
        return {"saved": note.title, "count": len(self.notes)}

    @tool
    def fail(self) -> None:
        """Always raises."""
        raise RuntimeError("tool broke")

    @tool(name="answer", description="Give the final answer; ends the episode.")
    def give_answer(self, value: int) -> ToolOutput:
        right = self.task is not None and value == self.task.answer
        return ToolOutput(
            content=[TextContent(text="right" if right else "wrong")],
            reward=1.0 if right else 0.0,
            finished=True,
            metadata={"expected": self.task.answer if self.task else None},
        )

    @tool
    def picture(self) -> ImageContent:
        """A 1x1 image."""
        return ImageContent(data="iVBORw0KGgo=", mime_type="image/png")

    @tool
    def unsendable(self) -> object:
        """Returns something that is not JSON."""
        return object()
