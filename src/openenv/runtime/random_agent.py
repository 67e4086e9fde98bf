"""``RandomAgent``: valid random actions from any environment's action schema.

>>> from pydantic import Field
>>> from openenv import Action
>>> class Move(Action):
...     steps: int = Field(ge=1, le=3)
...     note: str = ""
>>> agent = RandomAgent(Move, seed=3)
>>> action = agent.act(None)
>>> Move.model_validate(action).steps in {1, 2, 3}
True
"""

from __future__ import annotations

import contextlib
import datetime
import math
import random
import re
import string
import uuid
from typing import TYPE_CHECKING, Any

from openenv.json_schema import model_schema
from openenv.types import Action

if TYPE_CHECKING:
    from openenv.runtime.session import EpisodeSession

__all__ = ["RandomAgent", "sample_schema"]


class RandomAgent:
    """Samples a valid action from the action's JSON Schema at every step.

    With no schema, each episode fetches the environment's own (from the
    server's ``GET /schema``, or the in-process environment's model), so any
    environment can be smoke-tested with no agent code:
    ``Task(id="t0", env=url, agent=RandomAgent(seed=0))``.

    Episodes are reproducible: each one draws from a generator seeded by the
    agent's ``seed`` and the task's ``id`` and ``seed``, whichever engine runs it.

    Args:
        action: An ``Action`` class or its JSON Schema; ``None``: ask the environment.
        seed: Seeds every episode's generator together with the task's.
    """

    quick_act = True  # sampling never blocks: act() runs on the event loop, no thread hop

    def __init__(
        self,
        action: type[Action] | dict[str, Any] | None = None,
        seed: int | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        if isinstance(action, type):
            action = model_schema(action)
        self.schema = action
        self.seed = seed
        self.rng = rng or random.Random(seed)

    async def for_episode(self, session: EpisodeSession) -> RandomAgent:
        schema = self.schema if self.schema is not None else await session.action_schema()
        task = session.task
        rng = random.Random(f"{self.seed}:{task.id}:{task.seed}")
        return RandomAgent(schema, self.seed, rng=rng)

    def act(self, observation: Any) -> Any:
        if self.schema is None:
            raise TypeError(
                "RandomAgent() has no action schema; give it one (RandomAgent(MyAction)) "
                "or let the runtime fetch the environment's"
            )
        return sample_schema(self.schema, self.rng)


def sample_schema(schema: dict[str, Any], rng: random.Random) -> Any:
    """Draw one value that validates against a (pydantic-made) JSON Schema.

    >>> import random
    >>> sample_schema({"type": "integer", "minimum": 3, "maximum": 3}, random.Random(0))
    3
    >>> sample_schema({"enum": ["a"]}, random.Random(0))
    'a'
    """
    return _Sampler(schema, rng).sample(schema, "")


# Models nested deeper than this (a model within itself: a tree, a list) are
# sampled as small as their schema allows: null where it may be, no optional
# field, the fewest items. Drawn freely, a tree whose nodes hold a list of trees
# grows without end about half the time (a RecursionError).
_DEEP = 8


class _Unsampleable(TypeError):
    """A value no JSON can be: a field JSON Schema cannot describe (a ``numpy.ndarray``)."""


class _Sampler:
    def __init__(self, root: dict[str, Any], rng: random.Random) -> None:
        self.root = root
        self.rng = rng
        self.depth = 0  # how many $refs deep the value being drawn is

    def sample(self, schema: dict[str, Any], where: str) -> Any:
        rng = self.rng
        if "$ref" in schema:
            self.depth += 1
            try:
                return self.sample(self._resolve(schema["$ref"]), where)
            finally:
                self.depth -= 1
        if "x-python-type" in schema:  # openenv.json_schema's mark: JSON cannot be one
            raise _Unsampleable(
                f"RandomAgent cannot sample {where or 'the action'}: a "
                f"{schema['x-python-type']}, which JSON Schema cannot describe; give it a "
                f"default or write an agent for this environment"
            )
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                variants = schema[key]
                if self.depth > _DEEP:
                    variants = [v for v in variants if v.get("type") == "null"] or variants
                return self._one_of(variants, where)
        if "allOf" in schema:
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                merged.update(self._resolve(part["$ref"]) if "$ref" in part else part)
            return self.sample(merged, where)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = rng.choice(kind)
        if kind is None:
            kind = "object" if "properties" in schema else "null"
        method = getattr(self, f"_{kind}", None)
        if method is None:
            raise TypeError(f"RandomAgent cannot sample {where or 'the action'}: type {kind!r}")
        return method(schema, where)

    def _one_of(self, variants: list[dict[str, Any]], where: str) -> Any:
        chosen = self.rng.choice(variants)
        try:
            return self.sample(chosen, where)
        except _Unsampleable:
            # ``np.ndarray | None``: None, then, or whichever other variant can be.
            for variant in variants:
                if variant is not chosen:
                    with contextlib.suppress(_Unsampleable):
                        return self.sample(variant, where)
            raise

    def _resolve(self, ref: str) -> dict[str, Any]:
        if not ref.startswith("#/"):
            raise TypeError(f"RandomAgent cannot follow the schema reference {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part]
        resolved: dict[str, Any] = node
        return resolved

    def _null(self, schema: dict[str, Any], where: str) -> None:
        return None

    def _boolean(self, schema: dict[str, Any], where: str) -> bool:
        return self.rng.random() < 0.5

    def _integer(self, schema: dict[str, Any], where: str) -> int:
        low, high = -100, 100
        if "minimum" in schema:
            low = math.ceil(schema["minimum"])
            high = max(high, low)
        if "exclusiveMinimum" in schema:
            low = math.floor(schema["exclusiveMinimum"]) + 1
            high = max(high, low)
        if "maximum" in schema:
            high = math.floor(schema["maximum"])
            low = min(low, high)
        if "exclusiveMaximum" in schema:
            high = math.ceil(schema["exclusiveMaximum"]) - 1
            low = min(low, high)
        step = int(schema.get("multipleOf", 1))
        first = -(-low // step) * step
        if first > high:
            raise TypeError(f"RandomAgent cannot sample {where}: no integer fits {schema}")
        # randrange, not choice(range(...)): a range past 2**63 (int64's whole
        # span) has no len(). The same draws as choice otherwise.
        return self.rng.randrange(first, high + 1, step)

    def _number(self, schema: dict[str, Any], where: str) -> float:
        if "multipleOf" in schema:
            return float(self._integer(schema, where))
        given_low = schema.get("minimum", schema.get("exclusiveMinimum"))
        given_high = schema.get("maximum", schema.get("exclusiveMaximum"))
        # Unbounded sides are drawn within 100 of zero, or just past the other bound.
        if given_low is not None:
            low = float(given_low)
        else:
            low = -100.0 if given_high is None else min(-100.0, float(given_high) - 1.0)
        high = float(given_high) if given_high is not None else max(100.0, low + 1)
        value = self.rng.uniform(low, high)
        # An exclusive bound excludes its end point, which uniform() may return.
        if value == schema.get("exclusiveMinimum") or value == schema.get("exclusiveMaximum"):
            value = (low + high) / 2
        return value

    def _string(self, schema: dict[str, Any], where: str) -> str:
        if "pattern" in schema:
            sampled = sample_pattern(schema["pattern"], self.rng)
            if sampled is None:
                raise TypeError(
                    f"RandomAgent cannot sample {where}: strings matching {schema['pattern']!r}; "
                    f"write an agent for this environment"
                )
            return sampled
        fmt = schema.get("format")
        if fmt == "uuid":
            return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        if fmt == "date-time":
            moment = datetime.datetime.fromtimestamp(self.rng.randrange(2**31), datetime.UTC)
            return moment.isoformat()
        if fmt == "date":
            return datetime.date.fromordinal(self.rng.randrange(700_000, 760_000)).isoformat()
        if fmt == "time":
            return (
                (datetime.datetime.min + datetime.timedelta(seconds=self._seconds()))
                .time()
                .isoformat()
            )
        if fmt == "duration":
            return f"PT{self._seconds()}S"
        if fmt in ("uri", "email"):
            word = "".join(self.rng.choices(string.ascii_lowercase, k=8))
            return f"http://{word}.example/" if fmt == "uri" else f"{word}@example.com"
        low = int(schema.get("minLength", 0))
        high = int(schema.get("maxLength", max(low, 12)))
        length = self.rng.randint(low, high)
        return "".join(self.rng.choices(string.ascii_lowercase + " ", k=length))

    def _seconds(self) -> int:
        return self.rng.randrange(86_400)

    def _array(self, schema: dict[str, Any], where: str) -> list[Any]:
        prefix = schema.get("prefixItems", [])
        low = int(schema.get("minItems", len(prefix)))
        high = int(schema.get("maxItems", max(low, len(prefix) + 3)))
        length = low if self.depth > _DEEP else self.rng.randint(low, high)
        items = schema.get("items", {})
        out = [self.sample(s, f"{where}[{i}]") for i, s in enumerate(prefix[:length])]
        if items is not False:
            for i in range(len(out), length):
                try:
                    out.append(self.sample(items, f"{where}[{i}]"))
                except _Unsampleable:
                    if i < low:
                        raise
                    break  # as few items as it may have
        return out

    def _object(self, schema: dict[str, Any], where: str) -> dict[str, Any]:
        required = set(schema.get("required", ()))
        out: dict[str, Any] = {}
        for name, sub in schema.get("properties", {}).items():
            if name in required or (self.depth <= _DEEP and self.rng.random() < 0.5):
                try:
                    out[name] = self.sample(sub, f"{where}.{name}" if where else name)
                except _Unsampleable:
                    if name in required:
                        raise  # else left out: it has a default
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and not schema.get("properties"):
            for i in range(self.rng.randint(0, 3)):
                try:
                    out[f"key{i}"] = self.sample(extra, f"{where}.key{i}")
                except _Unsampleable:
                    break  # no keys but those it could sample
        return out


# Character classes a pattern may name, as the characters RandomAgent draws from.
_CLASSES = {
    "d": string.digits,
    "w": string.ascii_letters + string.digits + "_",
    "s": " ",
}
_ATOM = re.compile(r"\\([dws])|\\(.)|\[(\^?)((?:\\.|[^\]])+)\]|(\.)|([^\\\[\](){}*+?|^$])")
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}|([*+?])")


def sample_pattern(pattern: str, rng: random.Random) -> str | None:
    """A string matching ``pattern``, for the simple patterns schemas use; ``None`` if too hard.

    Handles literals, ``.``, ``\\d \\w \\s``, classes like ``[A-Za-z0-9_-]``,
    quantifiers ``{n}``, ``{n,m}``, ``* + ?`` and the anchors ``^ $``. Groups,
    alternation and lookarounds are beyond it. The result is checked against
    the pattern before it is returned.

    >>> sample_pattern("^[a-z]{5}$", random.Random(0)).isalpha()
    True
    >>> sample_pattern("^(a|b)+$", random.Random(0)) is None
    True
    """
    body = pattern.removeprefix("^").removesuffix("$")
    out: list[str] = []
    position = 0
    while position < len(body):
        atom = _ATOM.match(body, position)
        if atom is None:
            return None
        position = atom.end()
        alphabet = _alphabet(atom)
        if alphabet is None:
            return None
        low, high = 1, 1
        quantifier = _QUANTIFIER.match(body, position)
        if quantifier is not None:
            position = quantifier.end()
            if quantifier.group(3):
                low, high = {"*": (0, 4), "+": (1, 4), "?": (0, 1)}[quantifier.group(3)]
            else:
                low = int(quantifier.group(1))
                upper = quantifier.group(2)
                high = low if upper is None else int(upper) if upper else low + 4
        out.extend(rng.choice(alphabet) for _ in range(rng.randint(low, max(low, high))))
    sampled = "".join(out)
    return sampled if re.search(pattern, sampled) else None


def _alphabet(atom: re.Match[str]) -> str | None:
    named, escaped, negated, members, dot, literal = atom.groups()
    if named:
        return _CLASSES[named]
    if escaped is not None:
        return escaped
    if dot or literal is not None:
        return string.ascii_lowercase if dot else literal
    if negated:
        return None
    chars: list[str] = []
    index = 0
    while index < len(members):
        char = members[index]
        if char == "\\" and index + 1 < len(members):
            following = members[index + 1]
            chars.extend(_CLASSES.get(following, following))
            index += 2
        elif index + 2 < len(members) and members[index + 1] == "-":
            chars.extend(chr(c) for c in range(ord(char), ord(members[index + 2]) + 1))
            index += 3
        else:
            chars.append(char)
            index += 1
    return "".join(chars) or None
