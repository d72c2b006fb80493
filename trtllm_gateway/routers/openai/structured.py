"""Structured outputs and forced tool calls -> the one engine constraint (GuidedDecoding).

Sources, at most one per request: response_format (json_object, json_schema), vLLM's
structured_outputs (json, regex, choice, grammar, json_object) and its older guided_* fields,
and tool_choice "required" or a named function (a JSON schema of the call, as vLLM builds it).
Every JSON schema is closed first (routers/openai/closed_schema.py) unless the request opts out.
Every failure is a 400 naming the param the constraint came from.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from typing import Any

from trtllm_gateway.engine.guided import check_guided
from trtllm_gateway.engine.protocol import GuidedDecoding, InvalidRequestError
from trtllm_gateway.routers.openai.closed_schema import close_objects
from trtllm_gateway.routers.openai.schemas import (
    ChatCompletionRequest,
    ChatTool,
    NamedToolChoice,
    SamplingFields,
)
from trtllm_gateway.web.errors import BadRequestError

_REGEX_SPECIAL = set("\\.^$|?*+()[]{}")


@dataclass(frozen=True, slots=True)
class Constraint:
    guided: GuidedDecoding
    param: str  # the request field it came from, for 400s


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of the choices (escaping only what regex syntax needs)."""
    escaped = ("".join(f"\\{c}" if c in _REGEX_SPECIAL else c for c in x) for x in choices)
    return "(" + "|".join(escaped) + ")"


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise BadRequestError(f"{param} is not valid JSON: {exc}", param=param) from exc
    if not isinstance(schema, dict):
        raise BadRequestError(f"{param} must be a JSON schema object.", param=param)
    return json.dumps(schema)  # check_constraint has llguidance validate it as a schema


def _choice(choices: list[str] | None, param: str) -> GuidedDecoding:
    if not choices:
        raise BadRequestError(f"{param} must list at least one choice.", param=param)
    return GuidedDecoding("regex", choice_regex(choices))


def _from_response_format(body: SamplingFields) -> list[Constraint]:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return []
    if fmt.type == "json_object":
        return [Constraint(GuidedDecoding("json_object"), "response_format")]
    param = "response_format"  # OpenAI names the field itself for a bad schema
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise BadRequestError("json_schema.schema is required.", param=param)
    return [Constraint(GuidedDecoding("json", _schema_text(fmt.json_schema.schema_, param)), param)]


def _from_structured_outputs(body: SamplingFields) -> list[Constraint]:
    out = []
    so = body.structured_outputs
    if so is not None:
        p = "structured_outputs"
        if so.json_ is not None:
            out.append(Constraint(GuidedDecoding("json", _schema_text(so.json_, f"{p}.json")), p))
        if so.regex is not None:
            out.append(Constraint(GuidedDecoding("regex", so.regex), f"{p}.regex"))
        if so.choice is not None:
            out.append(Constraint(_choice(so.choice, f"{p}.choice"), f"{p}.choice"))
        if so.grammar is not None:
            out.append(Constraint(GuidedDecoding("grammar", so.grammar), f"{p}.grammar"))
        if so.json_object:
            out.append(Constraint(GuidedDecoding("json_object"), f"{p}.json_object"))
    if body.guided_json is not None:
        spec = _schema_text(body.guided_json, "guided_json")
        out.append(Constraint(GuidedDecoding("json", spec), "guided_json"))
    if body.guided_regex is not None:
        out.append(Constraint(GuidedDecoding("regex", body.guided_regex), "guided_regex"))
    if body.guided_choice is not None:
        out.append(Constraint(_choice(body.guided_choice, "guided_choice"), "guided_choice"))
    if body.guided_grammar is not None:
        out.append(Constraint(GuidedDecoding("grammar", body.guided_grammar), "guided_grammar"))
    return out


def _parameters(tool: ChatTool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def named_tool(body: ChatCompletionRequest) -> ChatTool | None:
    """The tool a named tool_choice forces (400 when it names none of the tools)."""
    choice = body.tool_choice
    if not isinstance(choice, NamedToolChoice):
        return None
    tool = next((t for t in body.tools or () if t.function.name == choice.function.name), None)
    if tool is None:
        raise BadRequestError(
            f"tool_choice names `{choice.function.name}`, which is not in tools.",
            param="tool_choice",
        )
    return tool


def check_tools(body: ChatCompletionRequest) -> None:
    """tool_choice needs tools, and a named one must be among them (a forced call's schema is
    validated when its constraint compiles)."""
    if body.tool_choice not in (None, "none", "auto") and not body.tools:
        raise BadRequestError("tool_choice requires tools.", param="tool_choice")
    named_tool(body)


_DEFS = ("$defs", "definitions")


def _rewrite_refs(node: Any, renames: dict[str, str]) -> Any:
    if isinstance(node, list):
        return [_rewrite_refs(item, renames) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            for old, new in renames.items():
                if value == old or value.startswith(old + "/"):
                    value = new + value[len(old) :]
                    break
            out[key] = value
        else:
            out[key] = _rewrite_refs(value, renames)
    return out


def _hoist_definitions(index: int, params: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A tool's parameters as a subschema of the call list: its own definitions (pydantic's
    `$defs`) move to the root under `t{index}_` names, and its `$ref`s follow them; a ref to
    its own root (`#`, a recursive schema) points at a copy of it kept there too."""
    renames = {
        f"#/{key}/{name}": f"#/$defs/t{index}_{name}"
        for key in _DEFS
        for name in params.get(key) or {}
    }
    root = f"#/$defs/t{index}_root"
    renames["#"] = root  # last: only what no definition rename took
    for key in _DEFS:
        for name, sub in (params.get(key) or {}).items():
            defs[f"t{index}_{name}"] = _rewrite_refs(sub, renames)
    body = _rewrite_refs({k: v for k, v in params.items() if k not in _DEFS}, renames)
    if root in json.dumps(body) or any(root in json.dumps(d) for d in defs.values()):
        defs[f"t{index}_root"] = body
    return body


def _from_tool_choice(body: ChatCompletionRequest) -> list[Constraint]:
    tool = named_tool(body)
    if tool is not None:
        spec = json.dumps(_parameters(tool))
        return [Constraint(GuidedDecoding("json", spec), "tool_choice")]
    if body.tool_choice != "required":
        return []
    defs: dict[str, Any] = {}
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": _hoist_definitions(i, _parameters(t), defs),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for i, t in enumerate(body.tools or ())
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if defs:
        schema["$defs"] = defs
    if body.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return [Constraint(GuidedDecoding("json", json.dumps(schema)), "tool_choice")]


def build_constraint(body: SamplingFields) -> Constraint | None:
    """The request's one constraint, or None; two constraints are a 400."""
    found = _from_response_format(body) + _from_structured_outputs(body)
    if isinstance(body, ChatCompletionRequest):
        found += _from_tool_choice(body)
    if len(found) > 1:
        names = ", ".join(c.param for c in found)
        raise BadRequestError(
            f"Only one output constraint per request (got {names}).", param=found[1].param
        )
    if not found:
        return None
    constraint = found[0]
    so = body.structured_outputs
    if constraint.guided.kind != "json" or (so and so.disable_additional_properties is False):
        return constraint
    closed = json.dumps(close_objects(json.loads(constraint.guided.spec)))
    return replace(constraint, guided=replace(constraint.guided, spec=closed))


def start_after(constraint: Constraint, token_ids: tuple[int, ...]) -> Constraint:
    """The constraint applied after these ids (the end of the reasoning)."""
    return replace(constraint, guided=replace(constraint.guided, start_after=token_ids))


async def check_constraint(constraint: Constraint, max_grammar_bytes: int) -> None:
    """Refuse a constraint that is too large or that the engine could not compile, off the
    event loop (engine.guided caches the compiled grammar by spec hash for the engine)."""
    try:
        await asyncio.to_thread(
            check_guided, constraint.guided, max_grammar_bytes, param=constraint.param
        )
    except InvalidRequestError as exc:
        raise BadRequestError(str(exc), param=constraint.param) from exc
