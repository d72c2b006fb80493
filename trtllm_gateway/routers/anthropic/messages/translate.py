"""A Messages request as a chat request: system (a string or text blocks) as the one leading
system message, content blocks as chat parts, tool_use / tool_result as assistant tool calls and
tool messages, tools by input_schema, tool_choice (any: required; tool: the forced grammar),
thinking as the template's switch, stop_sequences, output_config.format as response_format."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from trtllm_gateway.routers.anthropic.messages.schemas import (
    CountTokensRequest,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from trtllm_gateway.routers.openai.schemas import ChatCompletionRequest
from trtllm_gateway.routers.openai.validation import renamed_param
from trtllm_gateway.web.errors import BadRequestError

# Chat's names in an error's param, as this API spells them (a message index is chat's, not the
# request's: system turns shift it, so only the field is named).
_PARAMS = {
    "response_format.json_schema": "output_config.format",
    "response_format": "output_config.format",
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
    "messages": "messages",
}


def wire_param(param: str | None) -> str | None:
    """An error's param from the chat request, named as the Messages request names it."""
    return renamed_param(param, _PARAMS)


def to_chat(body: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request that serves `body` (a MessagesRequest, or count_tokens' request)."""
    fields: dict[str, Any] = {"model": body.model, "messages": chat_messages(body)}
    if body.tools:
        fields["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                },
            }
            for t in body.tools
        ]
    if body.tool_choice is not None:
        fields.update(_tool_choice(body))
    if body.thinking is not None:
        enabled = body.thinking.type != "disabled"
        fields["chat_template_kwargs"] = {"enable_thinking": enabled}
    fmt = body.output_config.format if body.output_config else None
    if fmt is not None:
        schema = {"name": "output", "schema": fmt.schema_}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    if isinstance(body, MessagesRequest):
        fields.update(
            max_completion_tokens=body.max_tokens,
            stop=body.stop_sequences,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
        )
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise BadRequestError(f"{where}: {first.get('msg')}", param=where or None) from None


def _tool_choice(body: CountTokensRequest) -> dict[str, Any]:
    choice = body.tool_choice
    assert choice is not None
    out: dict[str, Any] = {}
    if choice.type == "tool":
        if not choice.name:
            raise BadRequestError("tool_choice type tool needs a name.", param="tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """`system` and the leading system turns become the one leading system message; a system
    turn later on is a user turn (merged into the user turn before it), since many chat
    templates refuse a system message anywhere but first, or drop it."""
    if not body.messages:
        raise BadRequestError("messages must not be empty.", param="messages")
    system = body.system
    texts = [system] if isinstance(system, str) else [b.text for b in system or ()]
    turns = list(body.messages)
    while turns and turns[0].role == "system":
        texts.append(_text(turns.pop(0).content))
    offset = len(body.messages) - len(turns)
    messages: list[dict[str, Any]] = []
    if any(texts):
        messages.append({"role": "system", "content": "\n\n".join(t for t in texts if t)})
    names: dict[str, str] = {}  # tool_use id -> tool name (templates name a tool's result)
    for index, message in enumerate(turns, offset):
        if message.role == "assistant":
            messages.append(_assistant(message, names))
        elif message.role == "system":
            _merge_user(messages, _text(message.content))
        else:
            messages.extend(_user(message, index, names))
    return messages


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.text for b in content if isinstance(b, TextBlock))


def _merge_user(messages: list[dict[str, Any]], text: str) -> None:
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "user" and isinstance(last["content"], str):
        last["content"] += "\n\n" + text
    elif last is not None and last["role"] == "user":
        last["content"].append({"type": "text", "text": text})
    else:
        messages.append({"role": "user", "content": text})


def _assistant(message: InputMessage, names: dict[str, str]) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    names.update((b.id, b.name) for b in message.content if isinstance(b, ToolUseBlock))
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input)},
        }
        for b in message.content
        if isinstance(b, ToolUseBlock)
    ]
    out: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    return out  # thinking blocks are not fed back (chat templates drop them too)


def _user(message: InputMessage, index: int, names: dict[str, str]) -> list[dict[str, Any]]:
    """Tool results first, as tool messages (they answer the assistant's calls), then the rest."""
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            out.append(_tool_result(block, names.get(block.tool_use_id)))
        elif isinstance(block, TextBlock | ImageBlock):
            parts.append(_part(block, index))
        elif isinstance(block, ToolUseBlock):
            raise BadRequestError(
                "tool_use blocks belong to assistant messages.", param=f"messages[{index}]"
            )
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _part(block: TextBlock | ImageBlock, index: int) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    source = block.source
    if source.type == "url" and source.url:
        url = source.url
    elif source.type == "base64" and source.data and source.media_type:
        url = f"data:{source.media_type};base64,{source.data}"
    else:
        raise BadRequestError(
            "an image source needs url (type url) or media_type and data (type base64).",
            param=f"messages[{index}].content",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(block: ToolResultBlock, name: str | None) -> dict[str, Any]:
    content = block.content
    if not isinstance(content, str):
        content = "".join(b.text for b in content if isinstance(b, TextBlock))
    if block.is_error:
        content = f"Error: {content}"
    out = {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}
    if name is not None:
        out["name"] = name
    return out
