"""A Responses request as a chat request: the stored conversation, instructions and input items
as chat messages, the tools as chat tools (a custom tool as a function of one string), tool_choice,
text.format as response_format, reasoning effort, max_output_tokens and the sampling fields."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from trtllm_gateway.routers.openai.responses.schemas import (
    ContentPart,
    CustomTool,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    ItemReference,
    MessageItem,
    NamedToolChoice,
    NamespaceTool,
    ReasoningItem,
    ResponsesRequest,
)
from trtllm_gateway.routers.openai.schemas import ChatCompletionRequest
from trtllm_gateway.routers.openai.validation import renamed_param
from trtllm_gateway.web.errors import BadRequestError

ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])
# The one parameter a custom tool's function takes: the free-form text the model writes.
CUSTOM_INPUT = "input"
# Sampling fields the chat request has and a Responses request may carry as extensions (vLLM's).
_PASSED_EXTRAS = (
    "seed", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "stop", "min_tokens", "ignore_eos", "logit_bias", "vllm_xargs",
)  # fmt: skip
_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Chat's names in an error's param, as this API spells them (a message index is chat's, not the
# input's: instructions and hoisted messages shift it, so only the field is named).
_PARAMS = {
    "response_format.json_schema": "text.format",
    "response_format": "text.format",
    "max_completion_tokens": "max_output_tokens",
    "messages": "input",
}


def wire_param(param: str | None) -> str | None:
    """An error's param from the chat request, named as the Responses request names it."""
    return renamed_param(param, _PARAMS)


def input_items(body: ResponsesRequest) -> list[InputItem]:
    """The request's input as items (a string is one user message)."""
    if isinstance(body.input, str):
        return [MessageItem(role="user", content=body.input)] if body.input else []
    return list(body.input)


def load_items(stored: Sequence[dict[str, Any]]) -> list[InputItem]:
    """A stored conversation (output items included) as input items."""
    return ITEMS.validate_python(stored)


def flat_tools(body: ResponsesRequest) -> list[FunctionTool | CustomTool]:
    """The tools, a namespace's members in its place."""
    out: list[FunctionTool | CustomTool] = []
    for tool in body.tools or ():
        out.extend(tool.tools if isinstance(tool, NamespaceTool) else (tool,))
    return out


def custom_tool_names(body: ResponsesRequest) -> frozenset[str]:
    return frozenset(t.name for t in flat_tools(body) if isinstance(t, CustomTool))


def tool_namespaces(body: ResponsesRequest) -> dict[str, str]:
    """A namespace member's name -> its namespace (its calls name it)."""
    return {
        member.name: tool.name
        for tool in body.tools or ()
        if isinstance(tool, NamespaceTool)
        for member in tool.tools
    }


def to_chat(body: ResponsesRequest, items: Sequence[InputItem]) -> ChatCompletionRequest:
    """The chat request that serves `body`; `items`: the whole conversation (stored + input)."""
    if body.background:
        raise BadRequestError("background responses are not supported.", param="background")
    if not items:
        raise BadRequestError("input must not be empty.", param="input")
    fields: dict[str, Any] = {
        k: v for k, v in (body.model_extra or {}).items() if k in _PASSED_EXTRAS
    }
    fields.update(
        model=body.model,
        messages=chat_messages(body.instructions, items),
        max_completion_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        parallel_tool_calls=body.parallel_tool_calls,
        user=body.user,
    )
    tools = flat_tools(body)
    if tools:
        fields["tools"] = [_chat_tool(t) for t in tools]
    if body.tool_choice is not None:
        choice = body.tool_choice
        if isinstance(choice, NamedToolChoice):
            fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            fields["tool_choice"] = choice
    fields.update(_text_format(body))
    fields.update(_reasoning(body))
    if LOGPROBS_INCLUDE in (body.include or ()):
        fields.update(logprobs=True, top_logprobs=body.top_logprobs or 0)
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise BadRequestError(f"{where}: {first.get('msg')}", param=where or None) from None


def chat_messages(instructions: str | None, items: Sequence[InputItem]) -> list[dict[str, Any]]:
    """instructions and the leading system / developer messages become one leading system
    message; one later on joins the user turn before it (Codex sends developer messages first,
    and many chat templates refuse a system message anywhere but first)."""
    texts = [instructions] if instructions else []
    start = 0
    while start < len(items):
        item = items[start]
        if not (isinstance(item, MessageItem) and item.role in ("system", "developer")):
            break
        texts.append(_text_of(item.content))
        start += 1
    messages: list[dict[str, Any]] = []
    if any(texts):
        messages.append({"role": "system", "content": "\n\n".join(t for t in texts if t)})
    known = {item.id: item for item in items if getattr(item, "id", None)}
    names = {  # call id -> tool name (templates name a tool's result)
        item.call_id: item.name
        for item in items
        if isinstance(item, FunctionCallItem | CustomToolCallItem)
    }
    for index in range(start, len(items)):
        item = items[index]
        if isinstance(item, ItemReference):
            found = known.get(item.id)
            if found is None or isinstance(found, ItemReference):
                raise BadRequestError(
                    f"item_reference `{item.id}` names no item of this conversation.",
                    param=f"input[{index}].id",
                )
            item = found
        _add(messages, item, index, names)
    return messages


def _text_of(content: str | list[ContentPart]) -> str:
    return content if isinstance(content, str) else _text(content)


def _add(
    messages: list[dict[str, Any]], item: InputItem, index: int, names: dict[str, str]
) -> None:
    if isinstance(item, MessageItem):
        content = _content(item.content, index)
        if item.role in ("system", "developer"):
            _merge_user(messages, _text_of(item.content))
        else:
            messages.append({"role": item.role, "content": content})
    elif isinstance(item, FunctionCallItem | CustomToolCallItem):
        if isinstance(item, FunctionCallItem):
            arguments = item.arguments
        else:
            arguments = json.dumps({CUSTOM_INPUT: item.input})
        function = {"name": item.name, "arguments": arguments}
        call: dict[str, Any] = {"id": item.call_id, "type": "function", "function": function}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
            return
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
        output = item.output if isinstance(item.output, str) else _text(item.output)
        message = {"role": "tool", "tool_call_id": item.call_id, "content": output}
        if item.call_id in names:
            message["name"] = names[item.call_id]
        messages.append(message)
    elif isinstance(item, ReasoningItem):
        return  # the model's own thinking is not fed back (chat templates drop it too)


def _merge_user(messages: list[dict[str, Any]], text: str) -> None:
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "user" and isinstance(last["content"], str):
        last["content"] += "\n\n" + text
    elif last is not None and last["role"] == "user":
        last["content"].append({"type": "text", "text": text})
    else:
        messages.append({"role": "user", "content": text})


def _content(content: str | list[ContentPart], index: int) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.type == "input_image":
            if part.image_url is None:
                raise BadRequestError(
                    "input_image needs an image_url (file ids are not served here).",
                    param=f"input[{index}].content",
                )
            parts.append({"type": "image_url", "image_url": {"url": part.image_url}})
        elif part.type == "input_file":
            raise BadRequestError(
                "input_file parts are not supported.", param=f"input[{index}].content"
            )
        else:
            parts.append({"type": "text", "text": part.text or part.refusal or ""})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _text(parts: list[ContentPart]) -> str:
    return "".join(p.text or "" for p in parts)


def _chat_tool(tool: FunctionTool | CustomTool) -> dict[str, Any]:
    if isinstance(tool, FunctionTool):
        function: dict[str, Any] = {"name": tool.name, "description": tool.description}
        function.update(parameters=tool.parameters, strict=tool.strict)
        return {"type": "function", "function": function}
    description = tool.description or ""
    grammar = (tool.format or {}).get("definition")
    if grammar:
        description += f"\nThe input follows this grammar:\n{grammar}"
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string"}},
        "required": [CUSTOM_INPUT],
    }
    function = {"name": tool.name, "description": description or None, "parameters": parameters}
    return {"type": "function", "function": function}


def _text_format(body: ResponsesRequest) -> dict[str, Any]:
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type == "text":
        return {}
    if fmt.type == "json_object":
        return {"response_format": {"type": "json_object"}}
    if fmt.schema_ is None:
        raise BadRequestError("text.format json_schema needs a schema.", param="text.format")
    schema = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
    return {"response_format": {"type": "json_schema", "json_schema": schema}}


def _reasoning(body: ResponsesRequest) -> dict[str, Any]:
    effort = body.reasoning.effort if body.reasoning else None
    if effort is None:
        return {}
    if effort == "none":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    return {"reasoning_effort": _EFFORT[effort]}
