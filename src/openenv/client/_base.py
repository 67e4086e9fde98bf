"""What the async and sync clients share: URLs, model classes, reply decoding."""

from __future__ import annotations

import functools
import os
import ssl
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict

from openenv import protocol
from openenv.errors import ServerError, server_error, shown_url
from openenv.protocol_json import json_values
from openenv.tools import ToolInfo, ToolOutput
from openenv.types import Action, Observation, State, StepResult

if TYPE_CHECKING:
    import httpx

__all__ = [
    "ActT",
    "AnyObservation",
    "ClientCore",
    "ObsT",
    "StateT",
    "auth_headers",
    "error_from",
    "handshake_headers",
    "http_detail",
    "http_url",
    "ssl_context",
    "url_key",
    "ws_url",
]

ActT = TypeVar("ActT", bound=Action)
ObsT = TypeVar("ObsT", bound=Observation)
StateT = TypeVar("StateT", bound=State)


class AnyObservation(Observation):
    """The observation class of an untyped client: keeps whatever fields arrive."""

    model_config = ConfigDict(extra="allow")


_Reply = TypeVar(
    "_Reply",
    protocol.ObservationReply,
    protocol.StateReply,
    protocol.ToolsReply,
    protocol.ToolResultReply,
    protocol.PromptReply,
)

_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}


def ws_url(base_url: str, path: str = "/ws") -> str:
    """Turn ``http(s)://`` or ``ws(s)://`` base URLs into a session URL.

    >>> ws_url("http://localhost:8000")
    'ws://localhost:8000/ws'
    >>> ws_url("https://envs.example.com/echo/")
    'wss://envs.example.com/echo/ws'
    >>> ws_url("ws://localhost:8000/ws")
    'ws://localhost:8000/ws'
    """
    parts = urlsplit(base_url)
    scheme = _SCHEMES.get(parts.scheme)
    try:
        parts.port  # noqa: B018  # a bad port would surface only at connect, unnamed
    except ValueError:
        scheme = None
    if scheme is None or not parts.netloc:
        raise ValueError(
            f"{shown_url(base_url)!r} isn't a valid environment URL; "
            f"use http://host:port, https://..., ws://... or wss://..."
        )
    route = parts.path.rstrip("/")
    if not route.endswith(path):
        route += path
    return urlunsplit((scheme, parts.netloc, route, parts.query, ""))


def http_url(base_url: str) -> str:
    """The HTTP root of a server, from any URL form ``ws_url`` accepts.

    >>> http_url("ws://localhost:8000/ws")
    'http://localhost:8000'
    """
    parts = urlsplit(ws_url(base_url))
    scheme = "https" if parts.scheme == "wss" else "http"
    return urlunsplit((scheme, parts.netloc, parts.path.removesuffix("/ws"), "", ""))


def url_key(url: str) -> str | None:
    """The API key a URL carries as ``?api_key=`` (browsers send it so), if any.

    >>> url_key("http://localhost:8000/?api_key=k"), url_key("http://localhost:8000")
    ('k', None)
    """
    values = parse_qs(urlsplit(url).query).get("api_key")
    return values[0] if values else None


def auth_headers(
    headers: Mapping[str, str] | None = None, api_key: str | None = None
) -> dict[str, str]:
    """The extra headers of every request: ``headers``, and the API key (default:
    ``$OPENENV_API_KEY``) as a Bearer token.

    >>> auth_headers({"X-Trace": "1"}, api_key="k")
    {'X-Trace': '1', 'Authorization': 'Bearer k'}
    """
    extra = dict(headers or {})
    for name, value in extra.items():
        if not _sendable(value):
            raise ValueError(f"header {name!r} has a character an HTTP header cannot carry")
    given = api_key
    api_key = api_key or os.environ.get("OPENENV_API_KEY")
    if api_key:
        if not _sendable(api_key):
            # Not shown: sent, the HTTP libraries' errors would print it whole.
            where = "the API key" if given else "$OPENENV_API_KEY"
            raise ValueError(
                f"{where} has a character an HTTP header cannot carry "
                f"(a line break read from a file with the key, say)"
            )
        extra["Authorization"] = f"Bearer {api_key}"
    return extra


def _sendable(value: str) -> bool:
    """Whether ``value`` can be a header's value: visible ASCII, spaces and tabs,
    no line break."""
    return value.isascii() and all(c == "\t" or " " <= c <= "~" for c in value)


def handshake_headers(
    headers: Mapping[str, str] | None = None, api_key: str | None = None
) -> dict[str, str]:
    """The extra headers of a WebSocket handshake: ``auth_headers``, the key also as ``X-API-Key``.

    A fleet's directory answers ``/ws`` with a redirect to a replica, which
    checks the key; websockets drops ``Authorization`` on a redirect to another
    host, ``X-API-Key`` (which every openenv server reads) goes along, as the
    key goes to the replicas a ``ServerPool`` finds listed by the directory.

    >>> handshake_headers(api_key="k")
    {'Authorization': 'Bearer k', 'X-API-Key': 'k'}
    """
    extra = auth_headers(headers, api_key)
    api_key = api_key or os.environ.get("OPENENV_API_KEY")
    if api_key:
        extra["X-API-Key"] = api_key
    return extra


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """httpx's TLS context, made once per process (loading the CA bundle takes ~0.2 s)."""
    import httpx

    return httpx.create_ssl_context()


def http_detail(response: httpx.Response) -> str:
    """FastAPI's ``detail`` of an HTTP error: a message, or a list of validation errors."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):  # not JSON, or not an object
        return response.text or response.reason_phrase
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg', '')}" for e in detail
        )
    return str(detail)


class ClientCore(Generic[ActT, ObsT, StateT]):
    """Model classes and reply decoding, shared by every client shell.

    A subclass declares its classes once, as generic arguments, and never
    writes parsing code:

    >>> from openenv import Action, Observation, State
    >>> class Say(Action):
    ...     text: str
    >>> class Heard(Observation):
    ...     text: str
    >>> class ParrotCore(ClientCore[Say, Heard, State]):
    ...     pass
    >>> ParrotCore.observation_cls.__name__
    'Heard'
    """

    action_cls: type[Action] = Action
    observation_cls: type[Observation] = Observation
    state_cls: type[State] = State
    # Told of every exchange as it crossed the wire: (request frame, reply
    # frame, time.time() when sent). The runtime's recorder sets it.
    on_exchange: Callable[[str, str | bytes, float], None] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            args = typing.get_args(base)
            if len(args) != 3:
                continue
            for name, arg, root in zip(
                ("action_cls", "observation_cls", "state_cls"),
                args,
                (Action, Observation, State),
                strict=True,
            ):
                if isinstance(arg, type) and issubclass(arg, root):
                    setattr(cls, name, arg)

    def encode_action(self, action: ActT | dict[str, Any]) -> dict[str, Any]:
        if isinstance(action, dict):
            return action
        if not isinstance(action, self.action_cls):
            raise TypeError(
                f"step() takes a {self.action_cls.__name__} (or a dict of its fields), "
                f"got {type(action).__name__}"
            )
        return action.model_dump(mode="json")

    def decode_result(self, frame: str | bytes | dict[str, Any]) -> StepResult[ObsT]:
        reply = self._decode(frame, protocol.ObservationReply)
        observation = protocol.observation_from_payload(self.observation_cls, reply.data)
        return StepResult(
            observation=typing.cast(ObsT, observation),
            reward=reply.data.reward,
            done=reply.data.done,
        )

    def decode_state(self, frame: str | bytes | dict[str, Any]) -> StateT:
        reply = self._decode(frame, protocol.StateReply)
        return typing.cast(StateT, self.state_cls.model_validate(reply.data))

    @staticmethod
    def encode_reset(
        seed: int | None, episode_id: str | None, kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Reset arguments as JSON; models (a task, say) are sent as their fields."""
        data = {
            k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v
            for k, v in kwargs.items()
        }
        if seed is not None:
            data["seed"] = seed
        if episode_id is not None:
            data["episode_id"] = episode_id
        return data

    @staticmethod
    def encode_tool_call(
        name: str, arguments: Mapping[str, Any] | BaseModel | None, kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        if isinstance(arguments, BaseModel):
            arguments = arguments.model_dump(mode="json")
        # Models in the arguments (``items=[Item(...)]`` for ``items: list[Item]``) as JSON.
        return {"name": name, "arguments": json_values({**(arguments or {}), **kwargs})}

    def decode_tools(self, frame: str | bytes | dict[str, Any]) -> list[ToolInfo]:
        return self._decode(frame, protocol.ToolsReply).data.tools

    def decode_tool_result(self, frame: str | bytes | dict[str, Any]) -> ToolOutput:
        return self._decode(frame, protocol.ToolResultReply).data

    def decode_prompt(self, frame: str | bytes | dict[str, Any]) -> str:
        return self._decode(frame, protocol.PromptReply).data.prompt

    @staticmethod
    def _decode(frame: str | bytes | dict[str, Any], expected: type[_Reply]) -> _Reply:
        message = protocol.parse_server_message(frame)
        if isinstance(message, protocol.ErrorReply):
            details = message.data.model_extra or {}
            raise server_error(message.data.code, message.data.message, details)
        if not isinstance(message, expected):
            wanted = expected.model_fields["type"].default
            raise ValueError(f"expected a reply of type {wanted!r}, got {message.type!r}")
        return message


def error_from(data: Mapping[str, Any]) -> ServerError:
    """The exception an error reply's ``data`` stands for (its code, message and details).

    >>> error = error_from({"code": "CAPACITY_REACHED", "message": "full", "retry_after": 1})
    >>> type(error).__name__, str(error), error.details
    ('CapacityError', '[CAPACITY_REACHED] full', {'retry_after': 1})
    """
    details = {key: value for key, value in data.items() if key not in ("code", "message")}
    return server_error(protocol.ErrorCode(data["code"]), data["message"], details)
