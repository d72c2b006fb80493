"""routers/openai/structured.py: each request field -> one GuidedDecoding, and the 400s."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from trtllm_gateway.engine.protocol import GuidedDecoding
from trtllm_gateway.routers.openai.schemas import ChatCompletionRequest, CompletionRequest
from trtllm_gateway.routers.openai.structured import (
    build_constraint,
    check_constraint,
    check_tools,
    choice_regex,
    start_after,
)
from trtllm_gateway.web.errors import BadRequestError

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": SCHEMA},
}


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **fields}
    )


CLOSED = {**SCHEMA, "additionalProperties": False}
J = GuidedDecoding("json", json.dumps(CLOSED))  # every JSON schema is closed by default
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
    assert first["properties"] == {"name": {"type": "string", "enum": ["f"]}, "parameters": CLOSED}
    no_params = {"type": "object", "properties": {}, "additionalProperties": False}
    assert second["properties"]["parameters"] == no_params
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


NESTED = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "stops": {"type": "array", "items": {"$ref": "#/$defs/Stop"}},
        "meta": {"type": "object", "additionalProperties": {"type": "string"}},
        "extra": {"anyOf": [{"type": "object", "properties": {"x": {"type": "integer"}}}]},
        "const": {"const": {"properties": {"kept": 1}}},
    },
    "required": ["city"],
    "$defs": {"Stop": {"type": "object", "properties": {"name": {"type": "string"}}}},
}


def test_every_object_with_properties_is_closed_at_every_depth() -> None:
    """routers/openai/closed_schema.py: what xgrammar's strict_mode and vLLM's
    disable_additional_properties do (closed_schema.py cites both); explicit values and data
    keywords (`const`) are left alone."""
    import jsonschema

    tool = {"type": "function", "function": {"name": "f", "parameters": NESTED}}
    for fields in (
        {"tools": [tool], "tool_choice": NAMED},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": NESTED}}},
        {"guided_json": NESTED},
    ):
        constraint = build_constraint(chat(**fields))
        assert constraint is not None
        schema = json.loads(constraint.guided.spec)
        assert schema["additionalProperties"] is False
        assert schema["$defs"]["Stop"]["additionalProperties"] is False
        props = schema["properties"]
        assert props["meta"]["additionalProperties"] == {"type": "string"}
        assert props["extra"]["anyOf"][0]["additionalProperties"] is False
        assert props["const"] == NESTED["properties"]["const"]  # type: ignore[index]
        jsonschema.validate({"city": "Paris", "meta": {"k": "v"}}, schema)
        for bad in ({"city": "Paris", "location": "Europe"}, {"city": "P", "stops": [{"n": 1}]}):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(bad, schema)


def test_required_tool_calls_close_hoisted_definitions() -> None:
    from pydantic import BaseModel

    class Item(BaseModel):
        name: str

    class Order(BaseModel):
        items: list[Item]

    tool = {"type": "function", "function": {"name": "f", "parameters": Order.model_json_schema()}}
    constraint = build_constraint(chat(tools=[tool], tool_choice="required"))
    assert constraint is not None
    schema = json.loads(constraint.guided.spec)
    assert schema["$defs"]["t0_Item"]["additionalProperties"] is False


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [TOOL], "tool_choice": NAMED},
        {"response_format": JSON_SCHEMA},
        {SO: {"json": SCHEMA}},
    ],
)
def test_opt_out_keeps_the_schema_as_sent(fields: dict[str, Any]) -> None:
    so = {**fields.get(SO, {}), "disable_additional_properties": False}
    constraint = build_constraint(chat(**{**fields, SO: so}))
    assert constraint is not None
    assert constraint.guided == GuidedDecoding("json", json.dumps(SCHEMA))
    # true (vLLM's spelling of the default) closes, as unset does
    so_true = {**fields.get(SO, {}), "disable_additional_properties": True}
    closed = build_constraint(chat(**{**fields, SO: so_true}))
    assert closed is not None and closed.guided == J


def test_the_option_alone_is_no_constraint() -> None:
    option = {"disable_additional_properties": False}
    assert build_constraint(chat(structured_outputs=option)) is None
