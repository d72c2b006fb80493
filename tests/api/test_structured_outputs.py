"""Structured outputs over HTTP on the FakeEngine: the constraint reaches the engine from chat and
completions, exact SSE transcripts of a forced tool call and of a reasoning reply, and
--chat-template given as text."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.api.agent_helpers import WEATHER
from tests.api.sse_helpers import parse_sse
from tests.conftest import CHATML, MODEL
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.protocol import GuidedDecoding
from trtllm_gateway.engine.tokenizer import Tokenizer

TEMPLATE = CHATML.replace("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "reasoning_parser": "deepseek_r1",
            "chat_template": TEMPLATE,  # template text, not a file: opens the thinking block
        }
    )


def frames(text: str) -> list[Any]:
    """The transcript with the random parts (ids, timestamps) normalised."""
    events = parse_sse(text)
    out = []
    for event in events:
        if isinstance(event, dict):
            event = {k: v for k, v in event.items() if k not in ("id", "created")}
            for choice in event.get("choices", ()):
                for call in choice["delta"].get("tool_calls", ()):
                    if "id" in call:
                        assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
                        call["id"] = "call_X"
        out.append(event)
    return out


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        ],
        "usage": None,
    }


async def test_reasoning_transcript(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    fake_engine.script = tokenizer.encode("Hmm.</think>Hi", add_special_tokens=False)
    fake_engine.tokens_per_event = 100  # the whole reply in one event, then EOS
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    r = await client.post("/v1/chat/completions", json=body)
    assert frames(r.text) == [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hi", "reasoning_content": "Hmm.", "reasoning": "Hmm."}, "stop"),
        "[DONE]",
    ]
    prompt = tokenizer.decode(fake_engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")


async def test_forced_tool_call_transcript(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    fake_engine.script = tokenizer.encode('</think>{"city": "Paris"}', add_special_tokens=False)
    fake_engine.tokens_per_event = 100
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stream": True,
    }
    r = await client.post("/v1/chat/completions", json=body)
    call = {
        "index": 0,
        "id": "call_X",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    assert frames(r.text) == [
        chunk({"role": "assistant"}),  # OpenAI's tool-call deltas carry no content
        chunk({"tool_calls": [call]}, "stop"),  # forced by name: OpenAI's "stop"
        "[DONE]",
    ]
    guided = fake_engine.requests[0].sampling.guided
    assert guided is not None
    end_of_thinking = tuple(tokenizer.encode("</think>", add_special_tokens=False))
    assert guided.start_after == end_of_thinking


async def test_completions_take_a_constraint(
    client: httpx.AsyncClient, fake_engine: FakeEngine
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "response_format": fmt}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    closed = {**schema, "additionalProperties": False}  # routers/openai/closed_schema.py
    assert fake_engine.requests[0].sampling.guided == GuidedDecoding("json", json.dumps(closed))
    bad = {"model": MODEL, "prompt": "x", "structured_outputs": {"regex": "(a"}}
    r = await client.post("/v1/completions", json=bad)
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs.regex"
