"""The plain ``def`` steps of many sessions, run as one batch, and their replies.

A v2 frame (``server/mux.py``) carries the steps of many sessions. Those that
are plain steps of a plain ``def`` ``step`` for idle sessions skip the
sessions' tasks and callbacks: ``StepBatch.take_frame`` plans each (the same checks
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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from openenv import protocol, protocol_v2
from openenv.protocol import FrameError
from openenv.protocol_v2 import SessionKey
from openenv.server.direct_steps import BATCHED
from openenv.server.handoff import LaneTicket
from openenv.server.session_core import Call
from openenv.server.session_host import OPEN
from openenv.types import Observation

if TYPE_CHECKING:
    from openenv.server.sessions import Session

__all__ = ["BatchLane", "StepBatch"]


class BatchLane(Protocol):
    """What ``StepBatch.take_frame`` reads of a session's lane (``mux.Lane``)."""

    @property
    def task(self) -> object:
        """What serves the lane's queue (``None``: nothing, the lane is idle)."""

    @property
    def session(self) -> Session | None:
        """The lane's session (``None``: still opening)."""


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

    def take_frame(
        self,
        requests: list[Any],
        lanes: Mapping[SessionKey, BatchLane],
        start: Callable[[SessionKey, dict[str, Any], Any], None],
        refused: Callable[[FrameError], None],
    ) -> int:
        """Take the requests of a v2 frame, in order: a well-formed step of a plain
        ``def`` for the idle session of an idle lane joins this batch (the
        session busy from here until its reply; the lane is the step's owner,
        ``{"session": key}`` the head of its reply); any other request goes to
        ``start(key, request, lane)``, its ``session`` taken out of it, and one
        without a usable ``session`` to ``refused``. How many were refused."""
        bad = 0
        steps, calls, started = self.steps, self.calls, self.started
        for request in requests:
            try:  # a subscript: dict.get's method call is dearer
                key = request["session"] if type(request) is dict else None
            except KeyError:
                key = None
            if type(key) is not int:  # protocol_v2.session_key's common case, inline
                try:
                    key = protocol_v2.session_key(request)
                except FrameError as exc:
                    bad += 1
                    refused(exc)
                    continue
            lane = lanes.get(key)
            # The checks of Session.try_step and its _plain_step_call, written out
            # in this loop: through a call per request (or two), the loop's work
            # per batched step is 1% more (measured). The session is left in the
            # request: it is dropped once it joins, and deleting the key from each
            # was 0.7% of a v2 step.
            if (
                lane is not None
                and lane.task is None
                and (session := lane.session) is not None
                and session.direct_steps
                and not session.busy
                and session.state is OPEN
                and not session._async_step
                and (step := protocol.plain_step(request, 3)) is not None
            ):
                data, request_id = step
                call = session.batched_call
                try:
                    if call is None:  # the session's first batched step
                        call = session.batched_call = session.step_call(data, request_id, started)
                    else:
                        # Its last batched step's call, which nothing holds any more,
                        # planned anew here rather than in step_call (a call less).
                        call.args = (session._validate_action(data),)
                        call.request_id = request_id
                        call.started = started
                except Exception:  # a bad action: handle() plans it again, naming what is wrong
                    pass
                else:
                    session.busy = True
                    session._direct_step = BATCHED
                    steps.append((session, call, {"session": key}, lane))
                    calls.append((session.ticket, call.fn, call.args))
                    continue
            del request["session"]
            start(key, request, lane)
        return bad

    def batch_outcomes(self, outcomes: list[tuple[int, bool, Any]], /) -> None:
        """The ``BatchReceiver`` of ``Handoff.dispatch_batch``."""
        steps = self.steps
        encoded: list[dict[str, Any]] = []
        now = time.monotonic()
        dumped: type[Observation] | None = None  # the class ``to_python`` dumps
        to_python: Any = None
        mode = "json"
        for index, ok, value in outcomes:
            session, plan, head, owner = steps[index]
            if ok and session.state is OPEN and session._settled is None:
                # A batch's observations are mostly of one class: it is checked,
                # and its serializer looked up, once for each run of them.
                cls = type(value)
                if cls is not dumped and isinstance(value, Observation):
                    dumped, to_python = cls, None
                if cls is dumped:
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
            steps[0][0].count_steps(time.perf_counter() - self.started, len(encoded))
            try:
                self.encoded(encoded)
            except Exception:  # one of them cannot be encoded (an int past 64 bits)
                self._one_by_one(encoded)

    def _one_by_one(self, replies: list[dict[str, Any]]) -> None:
        """Encode each reply alone; one that cannot be encoded ends its session
        with an internal error, as it would have on the single step's path."""
        # A reply is the head its step was taken with (observation_reply fills
        # it in), so its step is found here, not noted for every reply.
        replied = {id(reply) for reply in replies}
        for session, _, head, owner in self.steps:
            if id(head) in replied:
                try:
                    self.encoded([head])
                except Exception as exc:
                    self.replied(owner, session.internal_error(exc, head.get("id")))

    def encoded(self, replies: list[dict[str, Any]]) -> None:
        """Observation replies, to encode together (each begun with its ``head``)."""
        raise NotImplementedError

    def replied(self, owner: Any, frame: str) -> None:
        """Any other reply of the step taken for ``owner``: a frame."""
        raise NotImplementedError
