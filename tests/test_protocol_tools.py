"""The tool, task and prompt messages of the wire format, with no sockets."""

from __future__ import annotations

import orjson
import pytest

from openenv import (
    EpisodeFinishedError,
    ErrorCode,
    JsonContent,
    State,
    TextContent,
    ToolInfo,
    ToolOutput,
    UnknownToolError,
    protocol,
)
from openenv.errors import server_error
from openenv.protocol import FrameError


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        ('{"type": "list_tools"}', protocol.ListToolsRequest),
        ('{"type": "call_tool", "data": {"name": "inc"}}', protocol.CallToolRequest),
        (
            '{"type": "call_tool", "data": {"name": "inc", "arguments": {"n": 1}}}',
            protocol.CallToolRequest,
        ),
        ('{"type": "get_prompt"}', protocol.GetPromptRequest),
        ('{"type": "get_prompt", "data": {"task": {"id": "t"}}}', protocol.GetPromptRequest),
    ],
)
def test_tool_requests_decode(frame: str, kind: type) -> None:
    assert isinstance(protocol.parse_client_message(frame), kind)


@pytest.mark.parametrize(
    "frame",
    [
        '{"type": "call_tool"}',
        '{"type": "call_tool", "data": {"arguments": {}}}',
        '{"type": "call_tool", "data": {"name": "x", "arguments": [1]}}',
        '{"type": "call_tool", "data": {"name": "x", "args": {}}}',
        '{"type": "get_prompt", "data": {"task": "t1"}}',
    ],
)
def test_malformed_tool_requests_are_validation_errors(frame: str) -> None:
    with pytest.raises(FrameError) as info:
        protocol.parse_client_message(frame)
    assert info.value.code is ErrorCode.VALIDATION_ERROR


def test_unknown_type_lists_the_tool_messages_too() -> None:
    with pytest.raises(FrameError, match="did you mean 'call_tool'") as info:
        protocol.parse_client_message('{"type": "call_tools"}')
    assert "list_tools" in info.value.message


def test_tool_replies_round_trip() -> None:
    info = ToolInfo(name="inc", description="Add.", input_schema={"type": "object"})
    reply = protocol.parse_server_message(protocol.tools_frame([info], 1))
    assert isinstance(reply, protocol.ToolsReply)
    assert (reply.data.tools, reply.id) == ([info], 1)

    output = ToolOutput(
        content=[TextContent(text="ok"), JsonContent(data={"v": 1})],
        reward=1.0,
        finished=True,
        metadata={"m": 2},
    )
    frame = protocol.tool_result_frame(output, "r")
    assert orjson.loads(frame) == {
        "type": "tool_result",
        "data": {
            "content": [{"type": "text", "text": "ok"}, {"type": "json", "data": {"v": 1}}],
            "reward": 1.0,
            "finished": True,
            "metadata": {"m": 2},
        },
        "id": "r",
    }
    reply = protocol.parse_server_message(frame)
    assert isinstance(reply, protocol.ToolResultReply)
    assert reply.data == output

    reply = protocol.parse_server_message(protocol.prompt_frame("count to 3"))
    assert isinstance(reply, protocol.PromptReply)
    assert reply.data.prompt == "count to 3"


def test_state_reports_a_finished_episode_only_when_asked() -> None:
    plain = orjson.loads(protocol.state_frame(State(step_count=1)))
    assert "done" not in plain["data"]
    finished = orjson.loads(protocol.state_frame(State(step_count=1), finished=True))
    assert finished["data"]["done"] is True
    ongoing = orjson.loads(protocol.state_frame(State(), finished=False))
    assert ongoing["data"]["done"] is False


def test_new_codes_are_not_fatal_and_raise_their_own_errors() -> None:
    assert ErrorCode.UNKNOWN_TOOL not in protocol.FATAL_CODES
    assert ErrorCode.EPISODE_FINISHED not in protocol.FATAL_CODES
    unknown = server_error(ErrorCode.UNKNOWN_TOOL, "no", {"tools": ["a", "b"]})
    assert isinstance(unknown, UnknownToolError)
    assert unknown.tools == ["a", "b"]
    assert isinstance(server_error(ErrorCode.EPISODE_FINISHED, "over", {}), EpisodeFinishedError)


def test_request_frames_for_tools() -> None:
    frame = protocol.request_frame("call_tool", {"name": "inc", "arguments": {"n": 1}}, 5)
    assert orjson.loads(frame) == {
        "type": "call_tool",
        "data": {"name": "inc", "arguments": {"n": 1}},
        "id": 5,
    }
