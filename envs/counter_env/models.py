"""What the counter environment's agents send and receive."""

from pydantic import Field

from openenv import Action, Observation, State, TaskSpec


class CounterTask(TaskSpec):
    """Reach ``target``, then submit."""

    target: int = Field(description="The number the counter must show at submit.")


class CounterAction(Action):
    """Add to the counter (the plain `step` interface; agents usually call the tools)."""

    amount: int = Field(default=1, description="How much to add; may be negative.")


class CounterObservation(Observation):
    """The counter and the target."""

    value: int = Field(default=0, description="The counter.")
    target: int = Field(default=0, description="The number to reach.")


class CounterState(State):
    """The episode's counter, target and whether a submit ended it."""

    value: int = 0
    target: int = 0
    done: bool = Field(default=False, description="Whether submit() has ended the episode.")
