"""The @tool decorator and ToolOutput, with no sockets."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, Field, ValidationError
from tool_envs import Note, ToolBox

from openenv import Environment, JsonContent, TextContent, ToolOutput, tool
from openenv.tools import tools_of


def test_tools_are_found_in_definition_order() -> None:
    assert list(tools_of(ToolBox)) == [
        "add",
        "shout",
        "where_sync",
        "where_async",
        "save",
        "fail",
        "answer",
        "picture",
        "unsendable",
    ]


def test_schema_and_description_come_from_parameters_and_docstring() -> None:
    info = tools_of(ToolBox)["add"].info
    assert info.description == "Add two numbers."
    assert info.input_schema == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "a": {"description": "The first number.", "title": "A", "type": "integer"},
            "b": {
                "default": 2,
                "description": "The second number, two unless given.",
                "title": "B",
                "type": "integer",
            },
        },
        "required": ["a"],
    }


def test_a_pydantic_model_parameter_is_the_arguments() -> None:
    spec = tools_of(ToolBox)["save"]
    assert spec.arguments is Note
    assert spec.info.input_schema["properties"].keys() == {"title", "body"}
    assert spec.info.input_schema["required"] == ["title"]
    env = ToolBox()
    assert spec.bind(env, Note(title="t"))() == {"saved": "t", "count": 1}


def test_name_and_description_can_be_given() -> None:
    info = tools_of(ToolBox)["answer"].info
    assert info.description == "Give the final answer; ends the episode."
    assert "give_answer" not in tools_of(ToolBox)


def test_annotated_constraints_reach_the_schema_and_validation() -> None:
    class Env(Environment):  # type: ignore[type-arg]
        @tool
        def move(self, steps: Annotated[int, Field(ge=1, le=3, description="How far.")]) -> int:
            return steps

    spec = tools_of(Env)["move"]
    assert spec.info.input_schema["properties"]["steps"] == {
        "description": "How far.",
        "maximum": 3,
        "minimum": 1,
        "title": "Steps",
        "type": "integer",
    }
    with pytest.raises(ValidationError):
        spec.arguments.model_validate({"steps": 4})
    with pytest.raises(ValidationError, match="Extra inputs"):
        spec.arguments.model_validate({"steps": 1, "speed": 2})


def test_inherited_tools_are_tools_of_the_subclass() -> None:
    class Louder(ToolBox):
        @tool
        def whisper(self, text: str) -> str:
            """Say it softer."""
            return text.lower()

    assert {"add", "whisper"} <= set(tools_of(Louder))
    assert "whisper" not in tools_of(ToolBox)


def test_unannotated_parameter_is_refused_with_the_fix() -> None:
    class Env(Environment):  # type: ignore[type-arg]
        @tool
        def go(self, where):  # type: ignore[no-untyped-def]
            return where

    with pytest.raises(TypeError, match=r"annotate parameter 'where' \(e.g. where: int\)"):
        tools_of(Env)


def test_create_app_refuses_a_misdeclared_tool_at_startup() -> None:
    from servers import Ping, Pong

    from openenv import create_app

    class Env(Environment):  # type: ignore[type-arg]
        @tool
        def go(self, where):  # type: ignore[no-untyped-def]
            return where

    with pytest.raises(TypeError, match="annotate parameter 'where'"):
        create_app(Env, Ping, Pong)


def test_var_args_are_refused() -> None:
    class Env(Environment):  # type: ignore[type-arg]
        @tool
        def go(self, *places: str) -> None: ...

    with pytest.raises(TypeError, match=r"\*args and \*\*kwargs cannot be tool arguments"):
        tools_of(Env)


def test_duplicate_names_are_refused() -> None:
    class Env(Environment):  # type: ignore[type-arg]
        @tool(name="go")
        def go_a(self) -> None: ...

        @tool(name="go")
        def go_b(self) -> None: ...

    with pytest.raises(TypeError, match="two tools named 'go'"):
        tools_of(Env)


@pytest.mark.parametrize("name", ["", "has space", "x" * 65])
def test_bad_tool_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="must be 1-64 letters"):
        tool(name=name)(lambda self: None)


def test_only_plain_methods_can_be_tools() -> None:
    with pytest.raises(TypeError, match="marks instance methods"):
        tool(staticmethod(lambda: None))  # type: ignore[call-overload]


class Point(BaseModel):
    x: int


@pytest.mark.parametrize(
    ("value", "content"),
    [
        ("hi", [TextContent(text="hi")]),
        (3, [JsonContent(data=3)]),
        ([1, "a"], [JsonContent(data=[1, "a"])]),
        ({"k": None}, [JsonContent(data={"k": None})]),
        (Point(x=1), [JsonContent(data={"x": 1})]),
        (None, []),
    ],
)
def test_plain_return_values_are_wrapped(value: object, content: list[object]) -> None:
    output = ToolOutput.wrap(value)
    assert output.content == content
    assert (output.reward, output.finished, output.metadata) == (None, False, {})


def test_a_tool_output_is_passed_through() -> None:
    output = ToolOutput(reward=0.5, finished=True)
    assert ToolOutput.wrap(output) is output


def test_a_value_that_is_not_json_fails_when_wrapped() -> None:
    with pytest.raises(TypeError):
        ToolOutput.wrap(object())


def test_text_and_data_accessors() -> None:
    output = ToolOutput(
        content=[TextContent(text="a"), JsonContent(data=[1]), TextContent(text="b")]
    )
    assert output.text == "a\nb"
    assert output.data == [1]
    assert ToolOutput().data is None
