"""A base class for TRL's ``GRPOTrainer(environment_factory=...)``, on an openenv client.

TRL makes one instance per rollout, calls ``reset(**dataset_row)`` before
generating, exposes every public method of the class to the model as a tool
(its signature and docstring become the tool's schema), and reads
``get_reward()`` when the rollout ends. All of that is plain synchronous code,
which is how ``EnvClient`` behaves outside an event loop. So a TRL user writes
only the tools:

>>> from openenv import TRLEnv
>>> from echo_env import EchoAction, EchoEnv
>>> class Echo(TRLEnv):
...     client_cls = EchoEnv
...     base_url = "http://localhost:8000"
...     def echo(self, message: str) -> str:
...         '''Echo a message back from the environment.
...
...         Args:
...             message: The message to echo.
...         '''
...         return self._step(EchoAction(message=message)).echoed_message
>>> # GRPOTrainer(..., environment_factory=Echo)
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, ClassVar

from openenv.client.async_ import EnvClient
from openenv.client.pool import ServerPool
from openenv.errors import (
    AuthenticationError,
    ConnectionFailedError,
    DeadlineError,
    EnvTimeoutError,
    SessionClosedError,
    SessionError,
)
from openenv.types import Action

__all__ = ["TRLEnv"]

# A step that failed so: it may have changed the episode, and earned a reward,
# unseen. DeadlineError is a step past the server's step_timeout: a blocking
# one runs on (its session ended), an async one was cut short part-way.
_UNSEEN = (
    SessionClosedError,
    SessionError,
    ConnectionFailedError,
    EnvTimeoutError,
    DeadlineError,
)


class TRLEnv:
    """One environment session per TRL rollout; subclass it and add tool methods.

    Class attributes:
        client_cls: The environment's ``EnvClient`` subclass.
        base_url: Its server's URL (or a ``ServerPool`` / comma-joined URLs).
        connect_wait: Seconds ``reset`` keeps trying to reach a server that
            cannot be reached (one restarting), before it raises
            ``ConnectionFailedError`` and TRL stops; 0 tries once.

    Everything here but ``reset`` and ``get_reward`` is private, because TRL
    offers every public method to the model as a tool. Override
    ``_reset_kwargs`` to pass dataset columns (a ``task``, a ``seed``) to the
    environment's ``reset``, and ``_prompt`` to add the first observation to
    the prompt.
    """

    client_cls: ClassVar[type[EnvClient[Any, Any, Any]]]
    base_url: ClassVar[str | ServerPool]
    connect_wait: ClassVar[float] = 60.0

    def __init__(self) -> None:
        # Typed blocking calls; EnvClient itself would block too (no loop runs in TRL's thread).
        self._client = self.client_cls(self.base_url).sync()
        self._reward = 0.0
        self._done = False
        self._lost = False
        self._had_session = False

    def reset(self, **kwargs: Any) -> str | None:
        """Start a new episode for the dataset row ``kwargs``; TRL calls this.

        TRL keeps its instances from one training step to the next, and a step
        can outlast the server's idle timeout (or the server may restart): a
        session found gone at ``reset`` is replaced by a new one, as a new
        episode begins anyway.
        """
        arguments = self._reset_kwargs(kwargs)
        try:
            result = self._reset_reaching(arguments)
        except (SessionClosedError, SessionError):
            if not self._had_session:
                raise  # refused from the start (the server is full, say): the caller's
            self._new_client()
            result = self._reset_reaching(arguments)
        self._had_session = True
        self._reward, self._done, self._lost = 0.0, result.done, False
        return self._prompt(result.observation)

    def _reset_reaching(self, arguments: dict[str, Any]) -> Any:
        """``reset``, tried again for ``connect_wait`` seconds while the server
        cannot be reached: a training run outlives a server's restart."""
        deadline = time.monotonic() + self.connect_wait
        pause = 0.25
        while True:
            try:
                return self._client.reset(**arguments)
            except AuthenticationError:
                raise  # a wrong key stays wrong
            except ConnectionFailedError:
                if time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)  # the blocking caller's thread: TRL's, or a pool's
            pause = min(pause * 2, 5.0)
            self._new_client()

    def _new_client(self) -> None:
        # One it cannot reach (its loop is in the process this one was forked
        # from) is gone for this process already.
        with contextlib.suppress(SessionClosedError):
            self._client.close()
        self._client = self.client_cls(self.base_url).sync()

    def get_reward(self) -> float | None:
        """The rewards of this episode's steps, summed; TRL calls this at the end.

        ``None`` if the session was lost mid-episode (a server restart, a
        dropped connection, a reply that never came, a step past the server's
        ``step_timeout``): that step may have been
        applied and rewarded unseen, so the sum is unknown. TRL scores such a
        rollout as NaN and gives it no advantage, rather than teaching the
        model that its moves earned nothing.
        """
        return None if self._lost else self._reward

    def _step(self, action: Action | dict[str, Any]) -> Any:
        """Apply ``action``, add its reward, return the observation (for a tool to read)."""
        if self._done:
            raise RuntimeError("the episode is over; no more actions")
        try:
            result = self._client.step(action)
        except _UNSEEN:
            self._lost = True
            raise  # TRL shows the model the error; the rollout is unscored
        self._reward += result.reward or 0.0
        self._done = result.done
        return result.observation

    def _reset_kwargs(self, row: dict[str, Any]) -> dict[str, Any]:
        """What of a dataset row goes to the environment's ``reset`` (default: nothing)."""
        return {}

    def _prompt(self, observation: Any) -> str | None:
        """Text TRL appends to the prompt after ``reset`` (default: none)."""
        return None

    def _close(self) -> None:
        """End the session (TRL reuses instances, so it never calls this itself)."""
        self._client.close()
