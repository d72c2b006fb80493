"""POST /v1/messages and /v1/messages/count_tokens on the FakeEngine: the anthropic SDK's own
parsing of our bodies and streams (its accumulator, anthropic/lib/streaming/_messages.py, needs
message_start first and contiguous block indexes), the raw event transcript, tools forced by
grammar with tool_use / tool_result, stop reasons, Anthropic-shaped errors (529 on overload), and
the error event mid-stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from fastapi import FastAPI

from tests.api.ops_helpers import serve
from tests.conftest import MAX_MODEL_LEN, MODEL, REPLY
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.protocol import EngineInfo
from trtllm_gateway.engine.tokenizer import Tokenizer

URL = "/v1/messages"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CONTEXT = MAX_MODEL_LEN * 8
TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """A template that renders tools and tool messages (Hermes), and the context it needs."""
    template = str(TEMPLATES / "hermes.jinja")
    return settings.model_copy(update={"chat_template": template, "max_model_len": CONTEXT})


@pytest.fixture
def engine_info(engine_info: EngineInfo) -> EngineInfo:
    return replace(engine_info, max_model_len=CONTEXT)


@pytest.fixture
async def sdk(
    lifespan_app: FastAPI, client: httpx.AsyncClient
) -> AsyncIterator[anthropic.AsyncAnthropic]:
    # This anthropic SDK speaks httpx2 (httpx's successor), which has the same ASGI transport.
    transport = httpx2.ASGITransport(app=lifespan_app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://test") as http:
        yield anthropic.AsyncAnthropic(
            base_url="http://test", api_key="unused", http_client=http, max_retries=0
        )


def sse_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        out.append((name[len("event: ") :], json.loads(data[len("data: ") :])))
    return out


def script(engine: FakeEngine, tokenizer: Tokenizer, text: str) -> None:
    engine.script = tokenizer.encode(text, add_special_tokens=False)


async def test_create_through_the_sdk(
    sdk: anthropic.AsyncAnthropic, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    m = await sdk.messages.create(
        model=MODEL,
        max_tokens=100,
        system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": "Hi"}],
        metadata={"user_id": "u1"},
    )
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == REPLY  # type: ignore[union-attr]
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.output_tokens == len(fake_engine.script) + 1  # + EOS
    assert m.usage.cache_read_input_tokens == 3
    prompt = tokenizer.decode(fake_engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert prompt.index("Be brief.") < prompt.index("Hi")  # system leads


async def test_stream_transcript_and_the_sdk_final_message(
    sdk: anthropic.AsyncAnthropic, client: httpx.AsyncClient
) -> None:
    body = {"model": MODEL, "max_tokens": 100, "messages": ASK, "stream": True}
    r = await client.post(URL, json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and "[DONE]" not in r.text
    events = sse_events(r.text)
    assert all(name == data["type"] for name, data in events)
    names = [n for n, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas >= 2
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert {d["index"] for n, d in events if n.startswith("content_block")} == {0}
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    async with sdk.messages.stream(model=MODEL, max_tokens=100, messages=ASK) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == REPLY and final.content[0].text == REPLY  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


async def test_max_tokens_and_stop_sequence(
    sdk: anthropic.AsyncAnthropic, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    m = await sdk.messages.create(model=MODEL, max_tokens=3, messages=ASK)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    script(fake_engine, tokenizer, "one two STOP three")
    m = await sdk.messages.create(model=MODEL, max_tokens=50, messages=ASK, stop_sequences=["STOP"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    assert m.content[0].text == "one two "  # type: ignore[union-attr]


async def test_max_tokens_past_the_context_is_clamped(
    sdk: anthropic.AsyncAnthropic, fake_engine: FakeEngine
) -> None:
    m = await sdk.messages.create(model=MODEL, max_tokens=CONTEXT * 2, messages=ASK)
    assert m.stop_reason == "end_turn"
    request = fake_engine.requests[0]
    assert len(request.prompt_token_ids) + request.sampling.max_tokens == CONTEXT


async def test_tool_use_round_trip_forced_by_grammar(
    sdk: anthropic.AsyncAnthropic, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, '{"city": "Paris"}')
    tool_choice = {"type": "tool", "name": "get_weather"}
    async with sdk.messages.stream(
        model=MODEL,
        max_tokens=100,
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=tool_choice,  # type: ignore[arg-type]
    ) as stream:
        final = await stream.get_final_message()
    (use,) = final.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    guided = fake_engine.requests[0].sampling.guided
    assert guided is not None and "city" in guided.spec
    plain = await sdk.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=tool_choice,  # type: ignore[arg-type]
    )
    assert plain.content[0].type == "tool_use" and plain.content[0].input == use.input
    script(fake_engine, tokenizer, "Sunny.")
    answer = await sdk.messages.create(
        model=MODEL,
        max_tokens=100,
        tools=[WEATHER],  # type: ignore[list-item]
        messages=[
            *ASK,  # type: ignore[list-item]
            {"role": "assistant", "content": [use.model_dump()]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "18C"},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
    )
    assert answer.content[0].text == "Sunny." and answer.stop_reason == "end_turn"  # type: ignore[union-attr]
    prompt = tokenizer.decode(fake_engine.requests[-1].prompt_token_ids, skip_special_tokens=False)
    assert prompt.index("18C") < prompt.index("And tomorrow?")


async def test_count_tokens(sdk: anthropic.AsyncAnthropic) -> None:
    short = await sdk.messages.count_tokens(model=MODEL, messages=ASK)  # type: ignore[arg-type]
    tools = await sdk.messages.count_tokens(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert 0 < short.input_tokens < tools.input_tokens


async def test_errors_are_anthropic_shaped(
    client: httpx.AsyncClient, sdk: anthropic.AsyncAnthropic
) -> None:
    r = await client.post(URL, json={"model": MODEL, "messages": ASK})  # no max_tokens
    assert r.status_code == 400
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    r = await client.post(URL, json={"model": "claude-x", "max_tokens": 5, "messages": ASK})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        await sdk.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x " * CONTEXT}]
        )
    # unknown fields are tolerated
    body = {"model": MODEL, "max_tokens": 5, "messages": ASK, "container": None, "future": 1}
    assert (await client.post(URL, json=body)).status_code == 200


async def test_overload_is_529(
    client: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    admission = app.state.drain.admission
    monkeypatch.setattr(admission, "capacity", 0)
    monkeypatch.setattr(admission, "in_flight", 1)
    r = await client.post(URL, json={"model": MODEL, "max_tokens": 5, "messages": ASK})
    assert r.status_code == 529, r.text
    assert r.json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": r.json()["error"]["message"]},
    }
    assert r.headers["retry-after"]


async def test_failure_mid_stream_is_an_error_event(
    client: httpx.AsyncClient, fake_engine: FakeEngine
) -> None:
    fake_engine.fail_after_tokens = 3
    body = {"model": MODEL, "max_tokens": 100, "messages": ASK, "stream": True}
    events = sse_events((await client.post(URL, json=body)).text)
    name, data = events[-1]
    assert name == "error" and data["type"] == "error"
    assert data["error"]["type"] == "api_error" and data["error"]["message"]


async def test_x_api_key_and_bearer_and_anthropic_headers(
    settings: Settings, fake_engine: FakeEngine
) -> None:
    body = {"model": MODEL, "max_tokens": 5, "messages": ASK}
    beta = {"anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024-04-04"}
    async with serve(settings, fake_engine, api_key=["sk-ant"]) as (_, client):
        for key in ({"x-api-key": "sk-ant"}, {"Authorization": "Bearer sk-ant"}):
            r = await client.post(URL, json=body, headers={**key, **beta})
            assert r.status_code == 200, r.text
        r = await client.post(URL, json=body, headers={"x-api-key": "wrong", **beta})
        assert r.status_code == 401
        assert r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "authentication_error"


async def test_only_leading_system_turns_are_hoisted(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    # Claude Code sends `role: "system"` turns inside messages (its reminders).
    messages = [
        {"role": "system", "content": "LEADING"},
        {"role": "user", "content": [{"type": "text", "text": "QUESTION"}]},
        {"role": "system", "content": [{"type": "text", "text": "REMINDER"}]},
    ]
    body = {"model": MODEL, "max_tokens": 5, "system": "SYSTEM", "messages": messages}
    r = await client.post(URL, json=body)
    assert r.status_code == 200, r.text
    prompt = tokenizer.decode(fake_engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    # One system message, first: the system param, then the leading turn.
    assert prompt.count("<|im_start|>system") == 1
    assert prompt.index("SYSTEM") < prompt.index("LEADING") < prompt.index("QUESTION")
    # The later system turn joins the user turn before it (no system message mid-conversation).
    user = prompt[prompt.index("<|im_start|>user") :]
    assert user.index("QUESTION") < user.index("REMINDER") < user.index("<|im_end|>")
