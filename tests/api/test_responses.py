"""POST /v1/responses (and GET / DELETE by id) on the FakeEngine: the openai SDK's own parsing of
our bodies and streams (its stream accumulator, openai/lib/streaming/responses/_responses.py,
raises on an event out of order), the event transcript itself, tools forced by grammar,
text.format, max_output_tokens, the store, and errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from tests.api.ops_helpers import serve
from tests.conftest import MAX_MODEL_LEN, MODEL, REPLY
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.tokenizer import Tokenizer

URL = "/v1/responses"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture
async def sdk(
    lifespan_app: FastAPI, client: httpx.AsyncClient
) -> AsyncIterator[openai.AsyncOpenAI]:
    transport = httpx.ASGITransport(app=lifespan_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield openai.AsyncOpenAI(
            base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0
        )


def sse_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of every frame; each frame must have both lines."""
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


async def test_text_reply_through_the_sdk(sdk: openai.AsyncOpenAI, fake_engine: FakeEngine) -> None:
    r = await sdk.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.")
    assert r.status == "completed" and r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == REPLY
    (message,) = r.output
    assert message.type == "message" and message.id.startswith("msg_")
    assert r.usage is not None and r.usage.output_tokens == len(fake_engine.script) + 1  # + EOS
    assert r.usage.input_tokens_details.cached_tokens == 3
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # instructions lead the prompt as a system message
    prompt = fake_engine.requests[0].prompt_token_ids
    assert fake_engine.requests[0].sampling.guided is None and prompt


async def test_stream_events_in_order_with_sequence_numbers(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json={"model": MODEL, "input": "Hi", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in r.text
    events = sse_events(r.text)
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    names = [name for name, _ in events]
    deltas = names.count("response.output_text.delta")
    assert deltas >= 2
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert text == REPLY
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == REPLY
    assert final["id"] == events[0][1]["response"]["id"]


async def test_sdk_stream_accumulates_to_the_final_response(sdk: openai.AsyncOpenAI) -> None:
    seen = []
    async with sdk.responses.stream(model=MODEL, input="Hi") as stream:
        async for event in stream:
            seen.append(event.type)
        final = await stream.get_final_response()
    assert final.output_text == REPLY and final.status == "completed"
    assert seen[0] == "response.created" and seen[-1] == "response.completed"


async def test_max_output_tokens_is_incomplete(
    sdk: openai.AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    r = await sdk.responses.create(model=MODEL, input="Hi", max_output_tokens=3)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 3
    assert r.output[0].status == "incomplete"
    streamed = await client.post(
        URL, json={"model": MODEL, "input": "Hi", "max_output_tokens": 3, "stream": True}
    )
    name, data = sse_events(streamed.text)[-1]
    assert name == "response.incomplete" and data["response"]["status"] == "incomplete"


async def test_forced_tool_call_by_grammar(
    sdk: openai.AsyncOpenAI, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, '{"city": "Paris"}')
    r = await sdk.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
    )
    (call,) = r.output
    assert call.type == "function_call" and call.id.startswith("fc_")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id
    guided = fake_engine.requests[0].sampling.guided
    assert guided is not None and guided.kind == "json" and "city" in guided.spec


async def test_streamed_tool_call_matches_and_a_round_trip(
    sdk: openai.AsyncOpenAI, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    # tool_choice required: the grammar's call list (tool_parsers/forced.py)
    script(fake_engine, tokenizer, '[{"name": "get_weather", "parameters": {"city": "Paris"}}]')
    async with sdk.responses.stream(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
    ) as stream:
        names = [e.type async for e in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.delta" in names
    (call,) = final.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    # The call and its output go back as items: the prompt shows both.
    script(fake_engine, tokenizer, "It is sunny.")
    r = await sdk.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "18C"},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert r.output_text == "It is sunny."
    prompt = tokenizer.decode(fake_engine.requests[-1].prompt_token_ids, skip_special_tokens=False)
    assert "18C" in prompt and "Paris" in prompt


class City(BaseModel):
    name: str
    population: int


async def test_parse_with_text_format(
    sdk: openai.AsyncOpenAI, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, '{"name": "Paris", "population": 2100000}')
    r = await sdk.responses.parse(model=MODEL, input="Paris?", text_format=City)
    assert r.output_parsed == City(name="Paris", population=2100000)
    guided = fake_engine.requests[0].sampling.guided
    assert guided is not None and "population" in guided.spec


async def test_custom_tool_is_one_string(
    sdk: openai.AsyncOpenAI, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, '{"input": "*** Begin Patch"}')
    tool = {"type": "custom", "name": "apply_patch", "description": "Edit files."}
    r = await sdk.responses.create(
        model=MODEL,
        input="Patch it.",
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "apply_patch"},
    )
    (call,) = r.output
    assert call.type == "custom_tool_call" and call.input == "*** Begin Patch"
    assert call.name == "apply_patch" and call.id.startswith("ctc_")


async def test_previous_response_id_chain_get_and_delete(
    sdk: openai.AsyncOpenAI, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, "Blue whales.")
    first = await sdk.responses.create(model=MODEL, input="Largest animal?")
    script(fake_engine, tokenizer, "About 30 m.")
    second = await sdk.responses.create(
        model=MODEL, input="How long?", previous_response_id=first.id
    )
    prompt = tokenizer.decode(fake_engine.requests[-1].prompt_token_ids, skip_special_tokens=False)
    assert "Largest animal?" in prompt and "Blue whales." in prompt and "How long?" in prompt
    assert second.previous_response_id == first.id
    got = await sdk.responses.retrieve(first.id)
    assert got.output_text == "Blue whales."
    deleted = await sdk.responses.delete(first.id)
    assert deleted is None  # the SDK returns nothing; a 404 would raise
    with pytest.raises(openai.NotFoundError) as info:
        await sdk.responses.create(model=MODEL, input="More?", previous_response_id=first.id)
    assert "previous_response_id" in str(info.value) or info.value.status_code == 404


async def test_store_false_stores_nothing(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json={"model": MODEL, "input": "Hi", "store": False})
    assert r.status_code == 200 and r.json()["store"] is False
    got = await client.get(f"{URL}/{r.json()['id']}")
    assert got.status_code == 404
    assert got.json()["error"]["code"] == "response_not_found"


async def test_errors_are_openai_shaped(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json={"model": MODEL, "input": [{"type": "nope"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    r = await client.post(
        URL, json={"model": MODEL, "input": "Hi", "previous_response_id": "resp_gone"}
    )
    assert r.status_code == 404 and "resp_gone" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "previous_response_id"
    r = await client.post(URL, json={"model": MODEL, "input": "x " * (MAX_MODEL_LEN * 2)})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = await client.post(URL, json={"model": MODEL, "input": "Hi", "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = await client.post(URL, json={"model": "other", "input": "Hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = await client.post(URL, json={"model": MODEL, "input": ""})
    assert r.status_code == 400


async def test_failure_mid_stream_is_response_failed(
    client: httpx.AsyncClient, fake_engine: FakeEngine
) -> None:
    fake_engine.fail_after_tokens = 3
    r = await client.post(URL, json={"model": MODEL, "input": "Hi", "stream": True})
    events = sse_events(r.text)
    name, data = events[-1]
    assert name == "response.failed" and data["response"]["status"] == "failed"
    assert data["response"]["error"]["code"] == "engine_dead"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))


async def test_an_evicted_response_is_a_clear_404(
    settings: Settings, fake_engine: FakeEngine
) -> None:
    async with serve(settings, fake_engine, response_store_max_count=1) as (_, client):
        first = (await client.post(URL, json={"model": MODEL, "input": "one"})).json()
        await client.post(URL, json={"model": MODEL, "input": "two"})  # evicts the first
        r = await client.post(
            URL, json={"model": MODEL, "input": "three", "previous_response_id": first["id"]}
        )
        assert r.status_code == 404
        error = r.json()["error"]
        assert error["code"] == "response_not_found" and error["param"] == "previous_response_id"
        assert "evicted" in error["message"] and "1 most recently used" in error["message"]


async def test_codex_shaped_request(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    """Codex's request (codex-cli 0.171, captured): developer messages first, a namespace of
    tools, a hosted web_search tool, include reasoning.encrypted_content, store false."""
    script(fake_engine, tokenizer, '{"name": "close_agent", "parameters": {"id": "a1"}}')
    member = {
        "type": "function",
        "name": "close_agent",
        "description": "Close an agent.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        "strict": False,
    }
    body = {
        "model": MODEL,
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"summary": "auto"},
        "tool_choice": "required",
        "tools": [
            {**WEATHER, "strict": False},
            {"type": "namespace", "name": "multi_agent_v1", "tools": [member]},
            {"type": "web_search", "external_web_access": False},
        ],
        "input": [
            {"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "DEVELOPER-ONE"}]},
            {"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "DEVELOPER-TWO"}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "QUESTION"}]},
            {"type": "message", "role": "developer", "content": "LATER"},
        ],
        "prompt_cache_key": "k",
        "client_metadata": {"turn_id": "t"},
    }  # fmt: skip
    r = await client.post(URL, json=body)
    assert r.status_code == 200, r.text
    final = sse_events(r.text)[-1][1]["response"]
    (call,) = final["output"]
    assert call["name"] == "close_agent" and call["namespace"] == "multi_agent_v1"
    prompt = tokenizer.decode(fake_engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert prompt.count("<|im_start|>system") == 1
    assert prompt.index("DEVELOPER-ONE") < prompt.index("DEVELOPER-TWO") < prompt.index("QUESTION")
    user = prompt[prompt.index("<|im_start|>user") :]
    assert user.index("QUESTION") < user.index("LATER") < user.index("<|im_end|>")


async def test_agent_apis_count_as_chat_in_the_metrics(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json={"model": MODEL, "input": "hi", "max_output_tokens": 4})
    assert r.status_code == 200
    ask = [{"role": "user", "content": "hi"}]
    body = {"model": MODEL, "max_tokens": 4, "messages": ask}
    assert (await client.post("/v1/messages", json=body)).status_code == 200
    text = (await client.get("/metrics")).text
    label = f'model_name="{MODEL}"'
    assert f"trtllm_gateway:generation_tokens_total{{{label}}} 8.0" in text
    assert f'trtllm_gateway:request_success_total{{finished_reason="length",{label}}} 2.0' in text
    assert f"trtllm_gateway:e2e_request_latency_seconds_count{{{label}}} 2.0" in text
    assert 'http_requests_total{handler="/v1/responses"' in text
    assert 'http_requests_total{handler="/v1/messages"' in text


async def test_error_params_name_the_responses_fields(client: httpx.AsyncClient) -> None:
    bad = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}
    r = await client.post(URL, json={"model": MODEL, "input": "Hi", "text": bad})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("text.format"), r.json()
    tool = {"type": "function", "name": "bad name!", "parameters": {}}
    r = await client.post(URL, json={"model": MODEL, "input": "Hi", "tools": [tool]})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("tools"), r.json()


async def test_input_items_lists_the_conversation(
    sdk: openai.AsyncOpenAI, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, "Blue whales.")
    first = await sdk.responses.create(model=MODEL, input="Largest animal?")
    second = await sdk.responses.create(
        model=MODEL, input="How long?", previous_response_id=first.id
    )
    items = [i async for i in sdk.responses.input_items.list(second.id, order="asc", limit=1)]
    assert [i.type for i in items] == ["message", "message", "message"]
    texts = [i.content[0].text for i in items]  # type: ignore[union-attr]
    assert texts == ["Largest animal?", "Blue whales.", "How long?"]
    assert all(i.id for i in items) and items[1].id == first.output[0].id
    newest = [i async for i in sdk.responses.input_items.list(second.id)]
    assert [i.id for i in newest] == [i.id for i in reversed(items)]  # desc by default
