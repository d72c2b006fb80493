"""Helpers for the tools / reasoning / structured-output api tests: tools, SSE reassembly."""

from __future__ import annotations

from typing import Any

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name."}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def reassemble(events: list[Any], index: int = 0) -> dict[str, Any]:
    """The message a client builds from a chat stream: content and reasoning concatenated,
    tool calls by index (id, type and name from their first delta, arguments concatenated)."""
    content, reasoning, alias = [], [], []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for event in events:
        if not isinstance(event, dict):
            continue
        for choice in event["choices"]:
            if choice["index"] != index:
                continue
            delta = choice["delta"]
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or "")
            alias.append(delta.get("reasoning") or "")
            for call in delta.get("tool_calls") or ():
                entry = calls.setdefault(call["index"], {"function": {"arguments": ""}})
                if "id" in call:
                    assert "name" in call["function"], "the first delta of a call names it"
                    entry.update(id=call["id"], type=call["type"])
                    entry["function"]["name"] = call["function"]["name"]
                entry["function"]["arguments"] += call["function"].get("arguments", "")
            finish = choice["finish_reason"] or finish
    assert "".join(reasoning) == "".join(alias)
    return {
        "content": "".join(content),
        "reasoning_content": "".join(reasoning),
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish,
    }


def message_view(body: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """A non-streamed choice in reassemble()'s shape."""
    choice = body["choices"][index]
    message = choice["message"]
    assert message.get("reasoning") == message.get("reasoning_content")
    return {
        "content": message["content"] or "",
        "reasoning_content": message.get("reasoning_content") or "",
        "tool_calls": message.get("tool_calls") or [],
        "finish_reason": choice["finish_reason"],
    }


def without_ids(view: dict[str, Any]) -> dict[str, Any]:
    """Call ids are random per request; compare everything else."""
    calls = [{k: v for k, v in c.items() if k != "id"} for c in view["tool_calls"]]
    return {**view, "tool_calls": calls}
