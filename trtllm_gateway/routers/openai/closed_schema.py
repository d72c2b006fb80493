"""Undeclared keys are not generated: a JSON schema's objects are closed before they constrain.

JSON Schema reads a missing `additionalProperties` as true, so a grammar built from it lets the
model add keys the schema never declared (a small model does: `{"city": "Paris", "location":
"Europe"}` for a tool that takes only `city`). The grammar engines people compare with do not:
xgrammar compiles JSON schemas in `strict_mode` by default (python/xgrammar/compiler.py,
`compile_json_schema`), which treats missing `additionalProperties` as false, and vLLM's default
structured-output backend is xgrammar; vLLM's guidance backend gets the same behaviour from
`disable_additional_properties` (vllm/v1/structured_output/backend_guidance.py,
`process_for_additional_properties`). So every object that declares `properties` and says nothing
about `additionalProperties` gets `"additionalProperties": false`, at every depth; an explicit
value (true, false or a schema) is kept. A request opts out with
`structured_outputs.disable_additional_properties: false`.
"""

from __future__ import annotations

from typing import Any

# Keywords whose value maps names to subschemas, and keywords whose value is a subschema or a
# list of them (JSON Schema 2020-12 plus the draft-07 spellings pydantic and zod still emit).
_SCHEMA_MAPS = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
)
_SUBSCHEMAS = (
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "contains",
    "propertyNames",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
)


def close_objects(schema: Any) -> Any:
    """A copy of `schema` whose objects with `properties` and no `additionalProperties` are
    closed; anything that is not a schema object is returned as it is."""
    if isinstance(schema, list):
        return [close_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: close_objects(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMAS:
            out[key] = close_objects(value)
        else:
            out[key] = value  # `enum`, `const`, `default`, `examples`: data, not schemas
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out
