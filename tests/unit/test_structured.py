"""routers/structured.py: each request field -> one GuidedDecoding, and the 400s."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from trtllm_gateway.app.errors import BadRequestError
from trtllm_gateway.engine.protocol import GuidedDecoding
from trtllm_gateway.routers.schemas import ChatCompletionRequest, CompletionRequest
from trtllm_gateway.routers.structured import (
    build_constraint,
    check_constraint,
    check_tools,
    choice_regex,
    start_after,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": SCHEMA},
}


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **fields}
    )


J = GuidedDecoding("json", json.dumps(SCHEMA))
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
}
NAMED = {"type": "function", "function": {"name": "f"}}
GRAMMAR = 'start: "a"'
SO = "structured_outputs"


@pytest.mark.parametrize(
    ("fields", "guided", "param"),
    [
        ({"response_format": {"type": "text"}}, None, None),
        (
            {"response_format": {"type": "json_object"}},
            GuidedDecoding("json_object"),
            "response_format",
        ),
        ({"response_format": JSON_SCHEMA}, J, "response_format"),
        ({SO: {"json": SCHEMA}}, J, SO),
        ({SO: {"json": json.dumps(SCHEMA)}}, J, SO),
        ({SO: {"regex": "a+"}}, GuidedDecoding("regex", "a+"), f"{SO}.regex"),
        ({SO: {"choice": ["x", "y"]}}, GuidedDecoding("regex", "(x|y)"), f"{SO}.choice"),
        ({SO: {"grammar": GRAMMAR}}, GuidedDecoding("grammar", GRAMMAR), f"{SO}.grammar"),
        ({SO: {"json_object": True}}, GuidedDecoding("json_object"), f"{SO}.json_object"),
        ({"guided_json": SCHEMA}, J, "guided_json"),
        ({"guided_regex": "b"}, GuidedDecoding("regex", "b"), "guided_regex"),
        ({"guided_choice": ["p"]}, GuidedDecoding("regex", "(p)"), "guided_choice"),
        ({"guided_grammar": GRAMMAR}, GuidedDecoding("grammar", GRAMMAR), "guided_grammar"),
        ({"tools": [TOOL], "tool_choice": NAMED}, J, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": "auto"}, None, None),
        ({"tools": [TOOL], "tool_choice": "none"}, None, None),
    ],
)
def test_sources(fields: dict[str, Any], guided: GuidedDecoding | None, param: str | None) -> None:
    constraint = build_constraint(chat(**fields))
    if guided is None:
        assert constraint is None
        return
    assert constraint is not None
    assert (constraint.guided, constraint.param) == (guided, param)


def test_required_schema() -> None:
    tools = [TOOL, {"type": "function", "function": {"name": "g"}}]
    constraint = build_constraint(chat(tools=tools, tool_choice="required"))
    assert constraint is not None
    schema = json.loads(constraint.guided.spec)
    assert schema["minItems"] == 1 and "maxItems" not in schema
    first, second = schema["items"]["anyOf"]
    assert first["properties"] == {"name": {"type": "string", "enum": ["f"]}, "parameters": SCHEMA}
    assert second["properties"]["parameters"] == {"type": "object", "properties": {}}
    one = build_constraint(chat(tools=tools, tool_choice="required", parallel_tool_calls=False))
    assert one is not None and json.loads(one.guided.spec)["maxItems"] == 1


def test_completions_take_structured_outputs_too() -> None:
    body = CompletionRequest.model_validate({"prompt": "x", "structured_outputs": {"regex": "a"}})
    constraint = build_constraint(body)
    assert constraint is not None and constraint.guided == GuidedDecoding("regex", "a")


def checked(body: ChatCompletionRequest) -> object:
    check_tools(body)
    return build_constraint(body)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({SO: {"json": "{not json"}}, f"{SO}.json"),
        ({SO: {"json": "[1]"}}, f"{SO}.json"),
        ({"guided_choice": []}, "guided_choice"),
        ({SO: {"regex": "a", "choice": ["b"]}}, f"{SO}.choice"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "z"}}},
            "tool_choice",
        ),
    ],
)
def test_bad_requests(fields: dict[str, Any], param: str) -> None:
    body = chat(**fields)
    with pytest.raises(BadRequestError) as info:
        checked(body)
    assert info.value.param == param


def test_tool_choice_needs_tools() -> None:
    with pytest.raises(BadRequestError) as info:
        check_tools(chat(tool_choice="required"))
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize("choices", [["a.b", "c|d", "(e)", "f+g?", "[h]", "{i}", "j\\k", "l m"]])
def test_choice_regex_matches_each_choice_literally(choices: list[str]) -> None:
    pattern = re.compile(choice_regex(choices))
    assert all(pattern.fullmatch(c) for c in choices)
    assert not pattern.fullmatch("aXb")


async def test_choice_regex_compiles_in_llguidance() -> None:
    constraint = build_constraint(chat(guided_choice=["a.b", "c|d", "l m", "x-y", "#~&"]))
    assert constraint is not None
    await check_constraint(constraint, 10_000)


async def test_too_large_and_invalid_are_400_with_the_param() -> None:
    constraint = build_constraint(chat(structured_outputs={"regex": "a" * 100}))
    assert constraint is not None
    with pytest.raises(BadRequestError, match="max-grammar-bytes") as info:
        await check_constraint(constraint, 50)
    assert info.value.param == "structured_outputs.regex"
    bad = build_constraint(
        chat(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}})
    )
    assert bad is not None
    with pytest.raises(BadRequestError) as info:
        await check_constraint(bad, 10_000)
    assert info.value.param == "response_format"


def test_start_after_keeps_the_rest() -> None:
    constraint = build_constraint(chat(guided_regex="a"))
    assert constraint is not None
    moved = start_after(constraint, (5, 6))
    assert moved.guided == GuidedDecoding("regex", "a", (5, 6)) and moved.param == "guided_regex"


async def test_required_schema_keeps_pydantic_definitions() -> None:
    """Tools generated from nested pydantic models carry `$defs`; in the call-list schema they
    move to the root (one namespace per tool) and the refs follow."""
    import jsonschema
    from pydantic import BaseModel

    class Address(BaseModel):
        city: str

    class Trip(BaseModel):
        start: Address
        end: Address

    params = Trip.model_json_schema()
    tools = [
        {"type": "function", "function": {"name": name, "parameters": params}}
        for name in ("plan", "book")
    ]
    constraint = build_constraint(chat(tools=tools, tool_choice="required"))
    assert constraint is not None
    await check_constraint(constraint, 100_000)  # llguidance resolves every ref
    schema = json.loads(constraint.guided.spec)
    assert set(schema["$defs"]) == {"t0_Address", "t1_Address"}
    good = {"start": {"city": "Paris"}, "end": {"city": "Rome"}}
    jsonschema.validate([{"name": "book", "parameters": good}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "book", "parameters": {"start": {}, "end": {}}}], schema)


async def test_required_schema_keeps_recursive_tools() -> None:
    """A hand-written recursive schema (`$ref: "#"`) still refers to itself inside the list."""
    import jsonschema

    tree = {
        "type": "object",
        "properties": {
            "label": {"type": "string"},
            "kids": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": ["label"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "draw", "parameters": tree}}]
    constraint = build_constraint(chat(tools=tools, tool_choice="required"))
    assert constraint is not None
    await check_constraint(constraint, 100_000)
    schema = json.loads(constraint.guided.spec)
    nested = {"label": "a", "kids": [{"label": "b", "kids": []}]}
    jsonschema.validate([{"name": "draw", "parameters": nested}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "draw", "parameters": {"label": "a", "kids": [{}]}}], schema)
