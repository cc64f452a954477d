"""Tools' input schemas, checked here (no JSON Schema library in ragctl's dependencies), and
the few helpers the tools build their schemas with. The checker knows the keywords below;
known_keywords() refuses a schema that uses another (each tool's, at import)."""

from __future__ import annotations

from typing import Any, Callable

from ragctl.mcp.wire import ToolError


class BadArguments(ToolError):
    """Tool arguments that break the tool's inputSchema."""


_ANNOTATIONS = {"description", "title", "default", "examples"}
_CHECKED = {"type", "properties", "required", "additionalProperties", "items", "enum",
            "minimum", "maximum", "minLength"}
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    # (JSON Schema: 2.0 is an integer — a number with no fractional part)
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)
                          or isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _json_type(v: Any) -> str:
    return next((t for t in ("boolean", "integer", "number", "string", "array", "object", "null")
                 if _TYPES[t](v)), type(v).__name__)


def check(schema: dict, value: Any, where: str) -> None:
    """Raise BadArguments naming the first way `value` breaks `schema`."""
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_TYPES[t](value) for t in types):
            raise BadArguments(f"{where} must be {' or '.join(types)}, got {_json_type(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise BadArguments(f"{where} must be one of {', '.join(map(str, schema['enum']))}, "
                           f"got {value!r}")
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            raise BadArguments(f"{where} must be at least {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            raise BadArguments(f"{where} must be at most {schema['maximum']}, got {value}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        raise BadArguments(f"{where} must not be empty" if schema["minLength"] == 1 else
                           f"{where} must be at least {schema['minLength']} characters long")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check(schema["items"], item, f"{where}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                raise BadArguments(f"missing argument '{name}'")
        if schema.get("additionalProperties") is False:
            unknown = sorted(set(value) - set(props))
            if unknown:
                raise BadArguments(f"unknown argument(s) {', '.join(map(repr, unknown))}; it "
                                   f"takes {', '.join(props) or 'none'}")
        for name, sub in props.items():
            if name in value:
                check(sub, value[name], f"'{name}'")
                if sub.get("type") == "integer" and isinstance(value[name], float):
                    value[name] = int(value[name])  # as ragd takes it


def known_keywords(schema: dict, where: str) -> None:
    unknown = set(schema) - _CHECKED - _ANNOTATIONS
    if unknown:
        raise AssertionError(f"{where}: check() does not know {sorted(unknown)}")
    for name, sub in schema.get("properties", {}).items():
        known_keywords(sub, f"{where}.{name}")
    if "items" in schema:
        known_keywords(schema["items"], f"{where}[]")


def obj(properties: dict, required=(), closed: bool = True) -> dict:
    schema: dict = {"type": "object", "properties": properties, "required": list(required)}
    if closed:
        schema["additionalProperties"] = False
    return schema


STR, INT, NUM, BOOL = ({"type": "string"}, {"type": "integer"}, {"type": "number"},
                       {"type": "boolean"})
OPT_STR = {"type": ["string", "null"]}
