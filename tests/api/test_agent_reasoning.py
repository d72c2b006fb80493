"""Reasoning through the agent APIs on the FakeEngine with --reasoning-parser qwen3: a Responses
`reasoning` item before the message (and reasoning_text events), a Messages `thinking` block
before the text (thinking_delta then signature_delta, indexes 0 then 1), each stream
accumulated by its own SDK to what the non-streamed call returns."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from fastapi import FastAPI

from tests.conftest import MODEL
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.tokenizer import Tokenizer

REPLY = "<think>\nThe capital of France.\n</think>\n\nParis."
ASK = [{"role": "user", "content": "Capital of France?"}]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"reasoning_parser": "qwen3"})


@pytest.fixture(autouse=True)
def scripted(fake_engine: FakeEngine, tokenizer: Tokenizer) -> None:
    fake_engine.script = tokenizer.encode(REPLY, add_special_tokens=False)


@pytest.fixture
async def clients(
    lifespan_app: FastAPI, client: httpx.AsyncClient
) -> AsyncIterator[tuple[openai.AsyncOpenAI, anthropic.AsyncAnthropic]]:
    transport = httpx.ASGITransport(app=lifespan_app)
    transport2 = httpx2.ASGITransport(app=lifespan_app)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://test") as http,
        httpx2.AsyncClient(transport=transport2, base_url="http://test") as http2,
    ):
        yield (
            openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http),
            anthropic.AsyncAnthropic(base_url="http://test", api_key="x", http_client=http2),
        )


def names(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in body.split("\n\n"):
        if block.strip():
            name, data = block.split("\n")
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def test_responses_reasoning_item(
    clients: tuple[openai.AsyncOpenAI, anthropic.AsyncAnthropic], client: httpx.AsyncClient
) -> None:
    sdk, _ = clients
    r = await sdk.responses.create(model=MODEL, input="Capital of France?")
    reasoning, message = r.output
    assert message.type == "message"
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.content is not None
    assert "The capital of France." in reasoning.content[0].text
    assert r.output_text.strip() == "Paris."
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
    async with sdk.responses.stream(model=MODEL, input="Capital of France?") as stream:
        final = await stream.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "message"]
    streamed = final.output[0]
    assert streamed.type == "reasoning" and streamed.content is not None
    assert streamed.content[0].text == reasoning.content[0].text
    assert final.output_text == r.output_text
    events = names((await client.post("/v1/responses", json={"input": "x", "stream": True})).text)
    kinds = [n for n, _ in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    added = [d["output_index"] for n, d in events if n == "response.output_item.added"]
    assert added == [0, 1]


async def test_messages_thinking_block(
    clients: tuple[openai.AsyncOpenAI, anthropic.AsyncAnthropic], client: httpx.AsyncClient
) -> None:
    _, sdk = clients
    m = await sdk.messages.create(model=MODEL, max_tokens=50, messages=ASK)  # type: ignore[arg-type]
    thinking, text = m.content
    assert thinking.type == "thinking" and "The capital of France." in thinking.thinking
    assert thinking.signature and text.type == "text" and text.text.strip() == "Paris."
    async with sdk.messages.stream(model=MODEL, max_tokens=50, messages=ASK) as stream:  # type: ignore[arg-type]
        final = await stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content]
    body = {"model": MODEL, "max_tokens": 50, "messages": ASK, "stream": True}
    events = names((await client.post("/v1/messages", json=body)).text)
    blocks = [(n, d.get("index"), (d.get("delta") or {}).get("type")) for n, d in events]
    deltas = [t for n, i, t in blocks if n == "content_block_delta" and i == 0]
    assert deltas[-1] == "signature_delta" and set(deltas[:-1]) == {"thinking_delta"}
    starts = [i for n, i, _ in blocks if n == "content_block_start"]
    stops = [i for n, i, _ in blocks if n == "content_block_stop"]
    assert starts == stops == [0, 1]
