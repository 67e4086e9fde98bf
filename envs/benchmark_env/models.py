"""What the benchmark environment's agents send and receive."""

from typing import Literal

from pydantic import Field

from openenv import Action, Observation


class BenchAction(Action):
    """How long the step should take, and how it spends that time."""

    seconds: float = Field(default=0.0, ge=0, le=3600, description="How long the step takes.")
    work: Literal["wait", "cpu"] = Field(
        default="wait",
        description="`wait` sleeps (time.sleep in the sync app, asyncio.sleep in the async "
        "app); `cpu` burns the CPU for that long.",
    )


class BenchObservation(Observation):
    """Who served the step: which process and which session, and how many steps so far."""

    pid: int = Field(default=0, description="Process id of the server that ran the step.")
    session: str = Field(default="", description="Fingerprint of the session's environment.")
    step: int = Field(default=0, ge=0, description="Steps taken in this episode.")
