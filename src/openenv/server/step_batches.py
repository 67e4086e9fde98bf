"""The plain ``def`` steps of many sessions, run as one batch, and their replies.

A v2 frame (``server/mux.py``) carries the steps of many sessions. Those that
are plain steps of a plain ``def`` ``step`` for idle sessions skip the
sessions' tasks and callbacks: ``StepBatch.take`` plans each (the same checks
as ``Session.try_step``, the same ``step_call`` of the I/O-free core),
``Handoff.dispatch_batch`` runs them on the worker threads, and
``batch_outcomes`` turns the outcomes that came back together into replies.

An observation (nearly every outcome) is answered as the core's ``finish``
answers it, but left as a dict (``protocol.observation_reply``, with the
serializer of its class looked up once for a run of that class), so the
transport encodes the replies of a group at once; their steps, planned together and answered
together, are counted in the step-time metric at once too. Anything else (an
error, an awaitable to await, a session that ended meanwhile, an observation
that cannot be sent) takes ``Session.batched_outcome``, the path of a single
step, and its frame goes to ``replied``. That split, and the session's
bookkeeping written out here rather than called, is a quarter of the loop
thread's work per echo step over v2 (``benchmarks/v2_path.py``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from openenv import protocol
from openenv.server.direct_steps import BATCHED
from openenv.server.handoff import LaneTicket
from openenv.server.session_core import Call
from openenv.server.session_host import OPEN
from openenv.types import Observation

if TYPE_CHECKING:
    from openenv.server.sessions import Session

__all__ = ["StepBatch"]


class StepBatch:
    """Plain ``def`` steps of many sessions, handed to the threads together.

    The transport subclasses it for where replies go: ``encoded`` gets the
    observation replies that came back together, as dicts still to encode
    (each begun with the ``head`` its step was taken with); ``replied`` gets
    any other reply of one step, as a frame, with the ``owner`` it was taken
    for. ``calls`` is what ``Handoff.dispatch_batch`` takes.
    """

    __slots__ = ("calls", "started", "steps")

    def __init__(self) -> None:
        self.started = time.perf_counter()  # when its steps count as planned (the metric's start)
        self.steps: list[tuple[Session, Call, dict[str, Any], Any]] = []  # with head and owner
        self.calls: list[tuple[LaneTicket, Callable[..., Any], tuple[Any, ...]]] = []

    def take(
        self, session: Session, request: dict[str, Any], head: dict[str, Any], owner: Any
    ) -> bool:
        """Plan ``request`` (a v2 request, its ``session`` still in it) into this
        batch if it is a well-formed step of a plain ``def`` for an idle
        ``session``, which is busy from here until its reply; ``False`` leaves it
        to ``try_step_request`` or ``handle``, as ``try_step`` does."""
        if (
            not session.direct_steps
            or session.busy
            or session.state is not OPEN
            or session._async_step
        ):
            return False
        # Session._plain_step_call, written out: through it (and an argument
        # tuple), the loop's work per batched step is a tenth more (measured).
        # Its session left in: a batched step's request is dropped, not kept,
        # and deleting the key from each was 0.5% of a v2 step (measured).
        step = protocol.plain_step(request, 3)
        if step is None:
            return False
        data, request_id = step
        call = session.batched_call
        try:
            if call is None:  # the session's first batched step
                call = session.batched_call = session.step_call(data, request_id, self.started)
            else:
                # Its last batched step's call, which nothing holds any more, planned
                # anew here rather than in step_call: a call less (1% of a v2 step).
                call.args = (session._validate_action(data),)
                call.request_id = request_id
                call.started = self.started
        except Exception:  # a bad action: handle() plans it again and names what is wrong
            return False
        session.busy = True
        session._direct_step = BATCHED
        self.steps.append((session, call, head, owner))
        self.calls.append((session.ticket, call.fn, call.args))
        return True

    def batch_outcomes(self, outcomes: list[tuple[int, bool, Any]], /) -> None:
        """The ``BatchReceiver`` of ``Handoff.dispatch_batch``."""
        steps = self.steps
        encoded: list[dict[str, Any]] = []
        which: list[int] = []  # the index of each of them
        now = time.monotonic()
        dumped: type[Observation] | None = None  # the class ``to_python`` dumps
        to_python: Any = None
        mode = "json"
        for index, ok, value in outcomes:
            session, plan, head, owner = steps[index]
            if ok and session.state is OPEN and session._settled is None:
                # A batch's observations are mostly of one class: it is checked,
                # and its serializer looked up, once for each run of them.
                if type(value) is not dumped and isinstance(value, Observation):
                    dumped, to_python = type(value), None
                if type(value) is dumped:
                    try:
                        if to_python is None:
                            to_python, mode = protocol.observation_serializer(dumped)
                        fields = to_python(value, mode=mode)
                        reply = protocol.observation_reply(value, plan.request_id, head, fields)
                    except Exception:  # it cannot be dumped: the single step's path says so
                        pass
                    else:
                        # SessionCore.finish and Session._step_reply, for this case, written out.
                        encoded.append(reply)
                        which.append(index)
                        session._bad_frames = 0
                        session.busy = False
                        session.last_active = now
                        session._direct_step = None
                        continue
            later = functools.partial(self.replied, owner)
            frame = session.batched_outcome(plan, ok, value, later)
            if frame is not None:  # None: an awaitable, whose reply comes later
                self.replied(owner, frame)
        if encoded:
            # Planned together (``started``) and answered together: one time for
            # all, in the one metric of the one service all the sessions are of.
            steps[which[0]][0].count_steps(time.perf_counter() - self.started, len(encoded))
            try:
                self.encoded(encoded)
            except Exception:  # one of them cannot be encoded (an int past 64 bits)
                self._one_by_one(encoded, which)

    def _one_by_one(self, replies: list[dict[str, Any]], which: list[int]) -> None:
        """Encode each reply alone; one that cannot be encoded ends its session
        with an internal error, as it would have on the single step's path."""
        for reply, index in zip(replies, which, strict=True):
            try:
                self.encoded([reply])
            except Exception as exc:
                session, _, _, owner = self.steps[index]
                self.replied(owner, session.internal_error(exc, reply.get("id")))

    def encoded(self, replies: list[dict[str, Any]]) -> None:
        """Observation replies, to encode together (each begun with its ``head``)."""
        raise NotImplementedError

    def replied(self, owner: Any, frame: str) -> None:
        """Any other reply of the step taken for ``owner``: a frame."""
        raise NotImplementedError
