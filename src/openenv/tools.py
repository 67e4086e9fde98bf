"""Tools: environment methods an agent calls by name with JSON arguments.

Mark a method with ``@tool``. Its arguments are its typed parameters (or one
pydantic model), its JSON Schema comes from them and its description from
the docstring. It returns a ``ToolOutput`` or any plain value, which is
wrapped into one.

>>> from openenv import Environment, tool
>>> class Lamp(Environment):
...     @tool
...     def switch(self, on: bool) -> str:
...         '''Turn the lamp on or off.
...
...         Args:
...             on: True to turn it on.
...         '''
...         return "on" if on else "off"
>>> spec = tools_of(Lamp)["switch"]
>>> spec.info.description
'Turn the lamp on or off.'
>>> spec.info.input_schema["properties"]["on"]
{'description': 'True to turn it on.', 'title': 'On', 'type': 'boolean'}
>>> ToolOutput.wrap(spec.fn(Lamp(), on=True)).text
'on'
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, overload

import orjson
from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, create_model

from openenv.json_schema import model_schema
from openenv.protocol_json import json_values

__all__ = [
    "ContentBlock",
    "ImageContent",
    "JsonContent",
    "TextContent",
    "ToolInfo",
    "ToolOutput",
    "ToolSpec",
    "tool",
    "tools_of",
]

_F = TypeVar("_F", bound=Callable[..., Any])

_MARKER = "__openenv_tool__"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # what MCP clients accept as a tool name


# -- what a tool returns -------------------------------------------------------


class TextContent(BaseModel):
    """Text for the agent to read."""

    type: Literal["text"] = "text"
    text: str


class JsonContent(BaseModel):
    """A JSON value (a number, a list, an object, ...) for programs to read."""

    # NaN and ±inf stay floats in a JSON-mode dump (else None), for frames to
    # write as "NaN", "Infinity" and "-Infinity", as in observations.
    model_config = ConfigDict(ser_json_inf_nan="strings")

    type: Literal["json"] = "json"
    data: Any


class ImageContent(BaseModel):
    """An image, base64-encoded."""

    type: Literal["image"] = "image"
    data: str = Field(description="The image bytes, base64-encoded.")
    mime_type: str = Field(description="e.g. image/png")


ContentBlock = Annotated[TextContent | JsonContent | ImageContent, Field(discriminator="type")]


# orjson writes these itself; passed through, they fail the check for plain JSON.
_ONLY_PLAIN = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


class ToolOutput(BaseModel):
    """What one tool call produced: content for the agent, a reward, the end of the episode.

    >>> out = ToolOutput(content=[TextContent(text="correct")], reward=1.0, finished=True)
    >>> out.text, out.reward, out.finished
    ('correct', 1.0, True)
    >>> ToolOutput.wrap({"value": 3}).data
    {'value': 3}
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")  # as JsonContent

    content: list[ContentBlock] = Field(default_factory=list)
    reward: float | None = Field(default=None, description="Reward earned by this call.")
    finished: bool = Field(default=False, description="Whether this call ended the episode.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form extra data.")

    @classmethod
    def wrap(cls, value: Any) -> ToolOutput:
        """A tool's return value as a ``ToolOutput``: text stays text, anything else is JSON.

        >>> ToolOutput.wrap("hi").content
        [TextContent(type='text', text='hi')]
        >>> ToolOutput.wrap(3).data, ToolOutput.wrap(None).content
        (3, [])
        """
        if isinstance(value, ToolOutput):
            return value
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls(content=[TextContent(text=value)])
        if isinstance(value, TextContent | JsonContent | ImageContent):
            return cls(content=[value])
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        try:
            orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:
            # Models in a list or dict (a tool's ``-> list[Item]``), sets: what
            # pydantic makes JSON of. Anything else fails here, in the tool
            # call, rather than later when the reply is encoded.
            value = json_values(value)
        return cls(content=[JsonContent(data=value)])

    def as_sent(self) -> ToolOutput:
        """This output as a client receives it: its JSON values and metadata plain
        JSON (NumPy values converted), its reward kept as it is, NaN included.

        Raises ``TypeError`` for what no transport can send (an arbitrary
        object, text that is no UTF-8), so the tool call fails, not its session.

        >>> import numpy as np
        >>> ToolOutput.wrap({"v": np.float32(0.5)}).as_sent().data
        {'v': 0.5}
        >>> ToolOutput(metadata={"f": open}).as_sent()
        Traceback (most recent call last):
        ...
        TypeError: Type is not JSON serializable: builtin_function_or_method
        """
        # Nearly every output is plain JSON already: checked, not rebuilt (5 µs a call).
        values = [b.text if isinstance(b, TextContent) else b.data for b in self.content]
        try:
            orjson.dumps([values, self.metadata], option=_ONLY_PLAIN)
        except TypeError:
            pass
        else:
            return self
        option = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
        fields = self.model_dump(exclude={"reward"})
        plain = orjson.loads(orjson.dumps(fields, option=option))
        return ToolOutput.model_validate({**plain, "reward": self.reward})

    @property
    def text(self) -> str:
        """The text blocks, joined by newlines."""
        return "\n".join(b.text for b in self.content if isinstance(b, TextContent))

    @property
    def data(self) -> Any:
        """The value of the first JSON block (``None`` without one)."""
        return next((b.data for b in self.content if isinstance(b, JsonContent)), None)


class ToolInfo(BaseModel):
    """A tool as agents see it: its name, what it does and the JSON Schema of its arguments."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


# -- declaring tools -----------------------------------------------------------


@dataclass(frozen=True)
class _Marker:
    fn: Callable[..., Any]
    name: str | None
    description: str | None


@dataclass(frozen=True)
class ToolSpec:
    """A tool of an environment class: how to validate its arguments and call it."""

    info: ToolInfo
    fn: Callable[..., Any]
    arguments: type[BaseModel]
    takes_model: bool  # the method takes the arguments model itself, not its fields
    positional: tuple[str, ...] = ()  # its positional-only parameters, in order

    @property
    def name(self) -> str:
        return self.info.name

    def bind(self, env: object, arguments: BaseModel) -> Callable[[], Any]:
        """The call of this tool on ``env`` with already validated ``arguments``."""
        method = self.fn.__get__(env)
        if self.takes_model:
            return functools.partial(method, arguments)
        values = dict(arguments)  # not getattr: a parameter may be named like a model method
        first = [values.pop(name) for name in self.positional]
        return functools.partial(method, *first, **values)


@overload
def tool(fn: _F, /) -> _F: ...
@overload
def tool(*, name: str | None = None, description: str | None = None) -> Callable[[_F], _F]: ...
def tool(
    fn: _F | None = None, /, *, name: str | None = None, description: str | None = None
) -> _F | Callable[[_F], _F]:
    """Make an environment method callable as a tool (``def`` or ``async def``).

    Use it bare (``@tool``) or with a ``name`` / ``description`` that
    replace the method's name and docstring.

    >>> from pydantic import BaseModel
    >>> from openenv import Environment
    >>> class Move(BaseModel):
    ...     dx: int
    ...     dy: int = 0
    >>> class Grid(Environment):
    ...     @tool(name="move", description="Move the cursor.")
    ...     async def move_cursor(self, args: Move) -> dict[str, int]:
    ...         return {"x": args.dx, "y": args.dy}
    >>> tools_of(Grid)["move"].info.input_schema["required"]
    ['dx']
    """

    def mark(fn: _F) -> _F:
        if isinstance(fn, staticmethod | classmethod) or not inspect.isfunction(fn):
            raise TypeError(f"@tool marks instance methods (def or async def), got {fn!r}")
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            # Its call would return a generator, which no transport can send.
            raise TypeError(f"@tool cannot mark {fn.__qualname__}, a generator: return a value")
        if name is not None and not _NAME.match(name):
            raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_', '-' or '.'")
        setattr(fn, _MARKER, _Marker(fn, name, description))
        return fn

    return mark(fn) if fn is not None else mark


def tools_of(env_cls: type) -> dict[str, ToolSpec]:
    """Every ``@tool`` of an environment class (inherited ones too), in definition order.

    Raises:
        TypeError: a tool's parameters cannot become a JSON Schema (one is not
            annotated, or it takes ``*args``/``**kwargs``), or two tools share a name.
    """
    return dict(_tools_of(env_cls))


@functools.cache
def _tools_of(env_cls: type) -> tuple[tuple[str, ToolSpec], ...]:
    specs: dict[str, ToolSpec] = {}
    # Definition order, base classes first: the order the author wrote them in.
    attrs = dict.fromkeys(a for klass in reversed(env_cls.__mro__) for a in vars(klass))
    for attr in attrs:
        marker = getattr(inspect.getattr_static(env_cls, attr, None), _MARKER, None)
        if not isinstance(marker, _Marker):
            continue
        spec = _build(env_cls, marker)
        if spec.name in specs:
            raise TypeError(f"{env_cls.__name__} has two tools named {spec.name!r}")
        specs[spec.name] = spec
    return tuple(specs.items())


def _build(env_cls: type, marker: _Marker) -> ToolSpec:
    fn = marker.fn
    where = f"tool {env_cls.__name__}.{fn.__name__}"
    name = marker.name or fn.__name__
    if not _NAME.match(name):
        raise TypeError(f"{where}: name {name!r} must be 1-64 letters, digits, '_', '-' or '.'")
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    params = list(inspect.signature(fn).parameters.values())[1:]  # drop self
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise TypeError(f"{where}: cannot resolve its annotations: {exc}") from exc
    for param in params:
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"{where}: *args and **kwargs cannot be tool arguments")
        if param.name not in hints:
            raise TypeError(f"{where}: annotate parameter {param.name!r} (e.g. {param.name}: int)")
    model_hint = hints.get(params[0].name) if len(params) == 1 else None
    if isinstance(model_hint, type) and issubclass(model_hint, BaseModel):
        arguments, takes_model = model_hint, True
    else:
        arguments = _arguments_model(where, name, params, hints, arg_docs)
        takes_model = False
    schema = model_schema(arguments)
    schema.pop("title", None)
    info = ToolInfo(
        name=name,
        description=marker.description if marker.description is not None else summary,
        input_schema=schema,
    )
    positional = tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY)
    return ToolSpec(info, fn, arguments, takes_model, () if takes_model else positional)


def _arguments_model(
    where: str,
    name: str,
    params: list[inspect.Parameter],
    hints: dict[str, Any],
    arg_docs: dict[str, str],
) -> type[BaseModel]:
    """The model of a tool's arguments, one field per parameter."""
    fields: dict[str, Any] = {
        p.name: (hints[p.name], _field(p, arg_docs.get(p.name))) for p in params
    }
    try:
        model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    except (PydanticUserError, NameError, ValueError) as exc:
        raise TypeError(f"{where}: its parameters cannot be tool arguments: {exc}") from None
    # pydantic keeps some names for itself (model_config, __private) without a word.
    if dropped := [p.name for p in params if p.name not in model.model_fields]:
        raise TypeError(f"{where}: rename parameter {dropped[0]!r}: pydantic reserves that name")
    return model


def _field(param: inspect.Parameter, doc: str | None) -> Any:
    default = ... if param.default is inspect.Parameter.empty else param.default
    # Set a description only when documented: an Annotated Field keeps its own.
    return Field(default) if doc is None else Field(default, description=doc)


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Yields|Raises|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """A Google-style docstring's text before its sections, and its ``Args:`` entries."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in doc.splitlines():
        header = _SECTION.match(line.strip())
        if header and not line.startswith(" "):
            section, current = header.group(1), None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            entry = _ARG_LINE.match(line.strip())
            if entry and line.startswith(" ") and len(line) - len(line.lstrip()) <= 4:
                current = entry.group(1).lstrip("*")
                args[current] = entry.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args
