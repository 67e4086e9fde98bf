"""__env_name__ itself: the game every session plays. Replace it with yours."""

import random
import uuid
from typing import Any

from openenv import EnvError, Environment, State

from __env_name__.models import __Prefix__Action, __Prefix__Observation


class __Prefix__Environment(Environment[__Prefix__Action, __Prefix__Observation, State]):
    """Guess a hidden number from 0 to 99; every hint says "higher" or "lower".

    A correct guess ends the episode with reward 1.0; running out of guesses
    ends it with 0.0. The seed decides the number, so episodes replay exactly.

    >>> env = __Prefix__Environment()
    >>> env.reset(seed=7).guesses_left
    7
    >>> env.step(__Prefix__Action(guess=50)).hint
    'lower'
    >>> result = env.step(__Prefix__Action(guess=41))
    >>> result.hint, result.reward, result.done
    ('correct', 1.0, True)
    """

    # Instances share nothing, so one server process may hold many at once.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_guesses: int = 7) -> None:
        self.max_guesses = max_guesses
        self._target = 0
        self._over = True
        self._state = State()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> __Prefix__Observation:
        self._target = random.Random(seed).randrange(100)
        self._over = False
        self._state = State(episode_id=episode_id or uuid.uuid4().hex)
        return __Prefix__Observation(guesses_left=self.max_guesses)

    def step(self, action: __Prefix__Action, **kwargs: Any) -> __Prefix__Observation:
        if self._over:
            # Raised errors reach the client as EXECUTION_ERROR and the session goes on;
            # an EnvError's message is shown to the client, any other only by its type.
            raise EnvError("no episode in progress: call reset() first")
        self._state.step_count += 1
        left = self.max_guesses - self._state.step_count
        if action.guess == self._target:
            self._over = True
            return __Prefix__Observation(hint="correct", guesses_left=left, reward=1.0, done=True)
        self._over = left == 0
        hint = "higher" if action.guess < self._target else "lower"
        return __Prefix__Observation(hint=hint, guesses_left=left, reward=0.0, done=self._over)

    @property
    def state(self) -> State:
        return self._state
