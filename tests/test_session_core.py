"""The session core without sockets, threads or an event loop: requests in, calls run
by hand, replies out. What every transport (``/ws`` v1 and v2, ``/web/ws``, MCP,
OpenReward's routes, the in-process runtime) answers is decided here."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from counter_env.models import CounterAction, CounterObservation, CounterTask
from counter_env.server.environment import CounterEnvironment
from openenv import Action, Environment, Observation, State
from openenv.protocol import CloseCode
from openenv.server import ServerSettings
from openenv.server.calls import DeadlineExceeded
from openenv.server.handoff import NotStarted
from openenv.server.metrics import Metrics
from openenv.server.session_core import Call, SessionCore
from openenv.server.session_host import SessionState
from openenv.server.slots import SessionRegistry


def core(**settings: Any) -> SessionCore:
    return SessionCore(
        CounterEnvironment(),
        CounterAction,
        ServerSettings(**settings),
        Metrics(SessionRegistry(1)),
    )


def run(session: SessionCore, request: dict[str, Any]) -> dict[str, Any] | None:
    """Plan ``request``, make its call (if any) right here, and decode the reply."""
    work = session.plan(request)
    if isinstance(work, Call):
        try:
            value = work.fn(*work.args, **work.kwargs)
        except Exception as exc:
            work = session.finish(work, False, exc)
        else:
            work = session.finish(work, True, value)
    return None if work is None else orjson.loads(work)


def test_a_step_is_one_call_of_env_step_with_the_validated_action() -> None:
    session = core()
    run(session, {"type": "reset", "data": {"task": {"id": "t", "target": 3}}})
    call = session.plan({"type": "step", "data": {"amount": 2}, "id": 9})
    assert isinstance(call, Call)
    assert (call.name, call.args, call.request_id) == ("step()", (CounterAction(amount=2),), 9)
    assert call.fn == session.env.step
    reply = orjson.loads(session.finish(call, True, call.fn(*call.args)))
    assert reply == {
        "type": "observation",
        "data": {"observation": {"value": 2, "target": 3}, "reward": None, "done": False},
        "id": 9,
    }
    assert session._metrics.steps == 1


def test_a_reset_takes_its_task_as_the_environment_s_model_and_keeps_it() -> None:
    session = core()
    call = session.plan({"type": "reset", "data": {"task": {"id": "t", "target": 4}}, "id": 1})
    assert isinstance(call, Call)
    assert call.kwargs == {"task": CounterTask(id="t", target=4)}
    assert session.task is None  # not before the reset has returned
    session.finish(call, True, call.fn(**call.kwargs))
    assert session.task == CounterTask(id="t", target=4)
    assert run(session, {"type": "get_prompt", "data": {}})["type"] == "prompt"  # type: ignore[index]


def test_refusals_are_answered_without_a_call_and_a_run_of_them_ends_the_session() -> None:
    session = core(max_bad_frames=3)
    for n in (1, 2):
        reply = session.plan({"type": "step", "data": {"amount": "many"}, "id": n})
        assert isinstance(reply, str)
        assert orjson.loads(reply)["data"]["code"] == "VALIDATION_ERROR"
    assert session.state is SessionState.OPEN
    run(session, {"type": "reset"})  # a good request clears the run
    for n in (3, 4):
        session.plan({"type": "jump", "id": n})
    assert session.state is SessionState.OPEN
    last = orjson.loads(session.plan({"type": "jump", "id": 5}))  # type: ignore[arg-type]
    assert last["data"]["code"] == "SESSION_ERROR"
    assert "3 bad frames in a row" in last["data"]["message"]
    assert (session.state, session.close_code) == (SessionState.CLOSING, CloseCode.POLICY_VIOLATION)


class Strict(Environment[Action, Observation, State]):
    """A reset that takes only what it names."""

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> Observation:
        return Observation()

    def step(self, action: Action, **kwargs: Any) -> Observation:
        return Observation()

    @property
    def state(self) -> State:
        return State()


def test_reset_refuses_arguments_the_environment_does_not_take() -> None:
    session = SessionCore(Strict(), Action, ServerSettings(), Metrics(SessionRegistry(1)))
    reply = run(session, {"type": "reset", "data": {"seed": 1, "difficulty": 9}, "id": 1})
    assert reply is not None
    assert reply["data"]["code"] == "VALIDATION_ERROR"
    assert "does not accept 'difficulty'; it accepts episode_id, seed" in reply["data"]["message"]


def test_a_tool_that_finishes_the_episode_closes_the_tools_until_a_reset() -> None:
    session = core()
    run(session, {"type": "reset", "data": {"task": {"id": "t", "target": 1}}})
    run(session, {"type": "call_tool", "data": {"name": "increment", "arguments": {"amount": 1}}})
    submitted = run(session, {"type": "call_tool", "data": {"name": "submit"}})
    assert submitted is not None
    assert submitted["data"]["reward"] == 1.0
    assert session.finished_by == "submit"
    again = run(session, {"type": "call_tool", "data": {"name": "get_value"}, "id": 7})
    assert again is not None
    assert again["data"]["code"] == "EPISODE_FINISHED"
    state = run(session, {"type": "state"})
    assert state is not None
    assert state["data"]["done"] is True  # a finished episode reads as done
    run(session, {"type": "reset"})
    assert session.finished_by is None


def test_an_unknown_tool_is_named_with_the_tools_there_are() -> None:
    reply = run(core(), {"type": "call_tool", "data": {"name": "incremnt"}, "id": 1})
    assert reply is not None
    assert reply["data"]["code"] == "UNKNOWN_TOOL"
    assert "did you mean 'increment'?" in reply["data"]["message"]


def test_a_step_that_returns_no_observation_is_an_execution_error() -> None:
    session = core()
    call = session.plan({"type": "step", "data": {}, "id": 1})
    assert isinstance(call, Call)
    reply = orjson.loads(session.finish(call, True, {"value": 1}))
    assert reply["data"]["code"] == "EXECUTION_ERROR"
    assert "returned dict, expected Observation" in reply["data"]["message"]
    assert session.state is SessionState.OPEN


def test_a_blocking_call_past_its_deadline_ends_the_session_and_is_kept_to_wait_for() -> None:
    session = core(step_timeout=0.5)
    call = session.plan({"type": "step", "data": {}, "id": 1})
    assert isinstance(call, Call)
    assert call.timeout == 0.5
    running = object()  # what the thread still runs as, for close() to wait on
    reply = orjson.loads(session.finish(call, False, DeadlineExceeded(0.5, running)))  # type: ignore[arg-type]
    assert reply["data"]["code"] == "TIMEOUT"
    assert reply["data"]["fatal"] is True
    assert (session.state, session.close_code) == (SessionState.CLOSING, CloseCode.INTERNAL_ERROR)
    assert session.stuck is running


def test_a_cancelled_call_past_its_deadline_leaves_the_session_open() -> None:
    session = core(step_timeout=0.5)
    call = session.plan({"type": "step", "data": {}, "id": 1})
    assert isinstance(call, Call)
    reply = orjson.loads(session.finish(call, False, DeadlineExceeded(0.5, None)))
    assert reply["data"] == {
        "message": "step() did not return within 0.5s and was cancelled",
        "code": "TIMEOUT",
    }
    assert session.state is SessionState.OPEN
    assert session.stuck is None


def test_a_call_that_never_started_says_why_the_session_is_closing() -> None:
    session = core()
    session._closing_because = "server shutting down"
    call = session.plan({"type": "step", "data": {}, "id": 1})
    assert isinstance(call, Call)
    reply = orjson.loads(session.finish(call, False, NotStarted("queued")))
    assert reply["data"] == {"message": "server shutting down", "code": "SESSION_ERROR"}


def test_close_plans_nothing_and_ends_the_session_normally() -> None:
    session = core()
    assert session.plan({"type": "close"}) is None
    assert (session.state, session.close_code) == (SessionState.CLOSING, CloseCode.NORMAL)


@pytest.mark.parametrize("request_id", [1, "a", None])
def test_an_internal_error_ends_the_session_with_the_request_s_id(request_id: Any) -> None:
    session = core()
    reply = orjson.loads(session.internal_error(SystemExit(3), request_id))
    assert reply["data"] == {"message": "internal server error", "code": "SESSION_ERROR"}
    assert reply.get("id") == request_id
    assert (session.state, session.close_code) == (SessionState.CLOSING, CloseCode.INTERNAL_ERROR)


def test_the_observation_type_reaches_the_reply_as_the_environment_made_it() -> None:
    session = core()
    call = session.plan({"type": "reset", "data": {"task": {"id": "t", "target": 2}}})
    assert isinstance(call, Call)
    observation = call.fn(**call.kwargs)
    assert isinstance(observation, CounterObservation)
    reply = orjson.loads(session.finish(call, True, observation))
    assert reply["data"]["observation"] == {"value": 0, "target": 2}
