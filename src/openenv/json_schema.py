"""JSON Schemas of user models, even of fields JSON Schema cannot describe.

OpenEnv's models allow any field type (``arbitrary_types_allowed``): a
``numpy.ndarray`` or a plain class validates and travels fine, but pydantic
raises ``PydanticInvalidForJsonSchema`` when asked for its schema. Everything
openenv serves or builds from a user model's schema (``/schema``, the web
page's form, tool input schemas) goes through ``model_schema``, which gives
such a field a permissive schema naming its Python type instead.

>>> import numpy as np
>>> from pydantic import BaseModel, ConfigDict
>>> class Frame(BaseModel):
...     model_config = ConfigDict(arbitrary_types_allowed=True)
...     step: int = 0
...     pixels: np.ndarray | None = None
>>> model_schema(Frame)["properties"]["pixels"]["anyOf"][0]["x-python-type"]
'numpy.ndarray'
>>> model_schema(Frame)["properties"]["step"]
{'default': 0, 'title': 'Step', 'type': 'integer'}
"""

# No `from __future__ import annotations`: the doctest's models would then need
# their annotations resolved in this module's namespace.
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = ["PermissiveJsonSchema", "model_schema"]


class PermissiveJsonSchema(GenerateJsonSchema):
    """pydantic's generator, with any value allowed where it would give up."""

    def handle_invalid_for_json_schema(self, schema: Any, error_info: str) -> JsonSchemaValue:
        python_type = _python_type(schema, error_info)
        return {
            "description": f"A {python_type}, which JSON Schema cannot describe.",
            "x-python-type": python_type,
        }


def _python_type(schema: CoreSchema, error_info: str) -> str:
    cls = schema.get("cls") if schema.get("type") in ("is-instance", "is-subclass") else None
    if isinstance(cls, type):
        module = "" if cls.__module__ == "builtins" else f"{cls.__module__}."
        return module + cls.__qualname__
    if schema.get("type") == "callable":
        return "callable"
    return error_info  # pydantic's own words for what it could not describe


def model_schema(
    model: type[BaseModel], mode: Literal["validation", "serialization"] = "validation"
) -> dict[str, Any]:
    """``model.model_json_schema(mode=mode)``, permissive where pydantic would raise."""
    return model.model_json_schema(mode=mode, schema_generator=PermissiveJsonSchema)
