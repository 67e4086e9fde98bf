"""The wire format, with no sockets: decoding client frames and encoding replies."""

from __future__ import annotations

import typing

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openenv import protocol
from openenv.protocol import ErrorCode, FrameError
from openenv.types import Observation, State


class Seen(Observation):
    text: str


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        ('{"type": "reset"}', protocol.ResetRequest),
        ('{"type": "reset", "data": {"seed": 3, "level": 2}}', protocol.ResetRequest),
        ('{"type": "step", "data": {"x": 1}}', protocol.StepRequest),
        ('{"type": "state"}', protocol.StateRequest),
        ('{"type": "close"}', protocol.CloseRequest),
        (b'{"type": "close", "id": "c"}', protocol.CloseRequest),
    ],
)
def test_valid_client_frames_decode(frame: str | bytes, kind: type) -> None:
    assert isinstance(protocol.parse_client_message(frame), kind)


@pytest.mark.parametrize(
    ("frame", "code", "request_id"),
    [
        ("{", ErrorCode.INVALID_JSON, None),
        ("null", ErrorCode.INVALID_JSON, None),
        ('"step"', ErrorCode.INVALID_JSON, None),
        ('{"type": "stpe", "id": 1}', ErrorCode.UNKNOWN_TYPE, 1),
        ('{"type": 5}', ErrorCode.UNKNOWN_TYPE, None),
        ('{"type": "step", "id": "s"}', ErrorCode.VALIDATION_ERROR, "s"),
        ('{"type": "step", "data": []}', ErrorCode.VALIDATION_ERROR, None),
        ('{"type": "state", "data": {}, "extra": 1}', ErrorCode.VALIDATION_ERROR, None),
        ('{"type": "state", "id": true}', ErrorCode.VALIDATION_ERROR, None),  # not id 1
        ('{"type": "state", "id": 2.0}', ErrorCode.VALIDATION_ERROR, None),
    ],
)
def test_bad_client_frames_name_the_problem(
    frame: str, code: ErrorCode, request_id: object
) -> None:
    with pytest.raises(FrameError) as info:
        protocol.parse_client_message(frame)
    assert info.value.code is code
    assert info.value.request_id == request_id
    assert info.value.message


def test_unknown_type_suggests_the_closest() -> None:
    with pytest.raises(FrameError, match="did you mean 'step'"):
        protocol.parse_client_message('{"type": "stpe"}')


def test_observation_frame_puts_reward_and_done_beside_the_fields() -> None:
    frame = orjson.loads(protocol.observation_frame(Seen(text="hi", reward=0.5, done=True), 3))
    assert frame == {
        "type": "observation",
        "data": {"observation": {"text": "hi"}, "reward": 0.5, "done": True},
        "id": 3,
    }


def test_observation_metadata_travels_only_when_set() -> None:
    frame = orjson.loads(protocol.observation_frame(Seen(text="", metadata={"k": 1})))
    assert frame["data"]["metadata"] == {"k": 1}


def test_server_frames_round_trip_into_typed_models() -> None:
    obs = Seen(text="hi", reward=1.0, done=False, metadata={"a": 1})
    message = protocol.parse_server_message(protocol.observation_frame(obs))
    assert isinstance(message, protocol.ObservationReply)
    assert protocol.observation_from_payload(Seen, message.data) == obs

    state = protocol.parse_server_message(protocol.state_frame(State(step_count=2, x=1)))
    assert isinstance(state, protocol.StateReply)
    assert state.data == {"episode_id": None, "step_count": 2, "x": 1}

    error = protocol.parse_server_message(
        protocol.error_frame(ErrorCode.CAPACITY_REACHED, "full", max_sessions=4)
    )
    assert isinstance(error, protocol.ErrorReply)
    assert error.data.code is ErrorCode.CAPACITY_REACHED
    assert error.data.model_extra == {"max_sessions": 4}


def test_malformed_server_frame_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="malformed frame"):
        protocol.parse_server_message('{"type": "observation"}')


def test_request_frame_leaves_out_what_is_unset() -> None:
    assert orjson.loads(protocol.request_frame("state")) == {"type": "state"}
    assert orjson.loads(protocol.request_frame("step", {"a": None}, 9)) == {
        "type": "step",
        "data": {"a": None},
        "id": 9,
    }


def test_fatal_codes_are_exactly_the_session_ending_ones() -> None:
    assert protocol.FATAL_CODES == {
        ErrorCode.CAPACITY_REACHED,
        ErrorCode.FACTORY_ERROR,
        ErrorCode.SESSION_ERROR,
    }


def test_observation_frame_carries_the_json_dump_of_every_field() -> None:
    from datetime import datetime

    from pydantic import BaseModel

    class Position(BaseModel):
        x: int

    class Located(Observation):
        pos: Position
        when: datetime
        tags: tuple[str, ...]

    seen = Located(
        pos=Position(x=1),
        when=datetime(2020, 1, 2),
        tags=("a",),
        reward=1.0,
        done=True,
        metadata={"k": 1},
    )
    assert orjson.loads(protocol.observation_frame(seen, 3)) == {
        "type": "observation",
        "data": {
            # A metadata that is not empty among the fields too, as OpenEnv sends it.
            "observation": seen.model_dump(mode="json", exclude={"reward", "done"}),
            "reward": 1.0,
            "done": True,
            "metadata": {"k": 1},
        },
        "id": 3,
    }


def test_an_observation_dumped_in_python_mode_leaves_its_arrays_to_orjson() -> None:
    import numpy as np
    from pydantic import BaseModel, ConfigDict

    class Position(BaseModel):
        x: int

    class Frame(Observation):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        dump_mode = "python"

        pixels: np.ndarray  # type: ignore[type-arg]
        pos: Position

    tenth = np.float32(0.1)
    seen = Frame(pixels=np.array([[tenth, 1.0]], dtype=np.float32), pos=Position(x=2))
    text = protocol.observation_frame(seen, 3)
    # float32 written as float32 (0.1, not the 0.10000000149011612 of tolist()),
    # and nested models dumped as pydantic dumps them.
    assert '"pixels":[[0.1,1.0]]' in text
    assert orjson.loads(text)["data"]["observation"] == {"pixels": [[0.1, 1.0]], "pos": {"x": 2}}
    assert float(np.float32(orjson.loads(text)["data"]["observation"]["pixels"][0][0])) == tenth


def test_every_client_message_type_is_decoded() -> None:
    # The fast per-type validators must cover the whole union, or a new message
    # type would be refused as UNKNOWN_TYPE.
    union = typing.get_args(typing.get_args(protocol.ClientMessage)[0])
    for cls in union:
        kind = cls.model_fields["type"].default
        data = {"name": "t"} if kind == "call_tool" else {}
        frame = orjson.dumps({"type": kind, "data": data} if kind != "state" else {"type": kind})
        if kind in {"close", "list_tools"}:
            frame = orjson.dumps({"type": kind})
        assert isinstance(protocol.parse_client_message(frame), cls)


_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=3),
    st.lists(st.integers()),
)
_FRAMES = st.fixed_dictionaries(
    {},
    optional={
        "type": st.one_of(st.sampled_from(["step", "reset", "Step"]), _ANY),
        "data": st.one_of(st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), _ANY),
        "id": _ANY,
        "session": _ANY,
        "extra": _ANY,
    },
)


@settings(max_examples=500, deadline=None)
@given(_FRAMES)
def test_plain_step_takes_exactly_the_steps_validation_takes_unchanged(frame: dict) -> None:
    # plain_step is validate_client_message's shortcut for nearly every frame: what
    # it takes, validation takes as a StepRequest with the same data and id; a
    # frame of only "type", "data" and "id" that validation takes as a step, it takes.
    step = protocol.plain_step(frame)
    try:
        message = protocol.validate_client_message(dict(frame))
    except FrameError:
        message = None
    is_step = isinstance(message, protocol.StepRequest)
    if step is not None:
        assert is_step
        assert (message.data, message.id) == step  # type: ignore[union-attr]
        assert set(frame) <= {"type", "data", "id"}
    elif is_step and set(frame) <= {"type", "data", "id"}:
        # Validation may coerce what plain_step leaves to it (a mapping that is
        # not a dict), never an id: a bool id is refused by both.
        assert type(frame.get("data")) is not dict
