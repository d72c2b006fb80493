"""The anthropic SDK, unmodified, against a live gateway on the real default model (SmolLM2 on
the built-in engine): messages.create, messages.stream() to its final message, count_tokens, and
a tool_use / tool_result round trip with the tool forced by grammar."""

from __future__ import annotations

import anthropic
import pytest

from tests.e2e.server import Server

MODEL = "SmolLM2-135M-Instruct"
# This SDK's create() takes no temperature (newer models fix it); the API field still exists.
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    # Claude Code's way in: ANTHROPIC_BASE_URL and an x-api-key (unused without --api-key).
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_create_answers(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=MODEL, max_tokens=60, messages=ASK, extra_body=GREEDY)  # type: ignore[arg-type]
    assert m.content[0].type == "text" and "Paris" in m.content[0].text
    assert m.stop_reason == "end_turn"
    # input_tokens leaves out the prefix cache's hits (cache_read_input_tokens), as Anthropic counts
    assert (m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)) > 10
    assert m.usage.output_tokens > 0


def test_stream_to_the_final_message_matches_create(client: anthropic.Anthropic) -> None:
    kwargs = {"model": MODEL, "max_tokens": 40, "messages": ASK, "extra_body": GREEDY}
    plain = client.messages.create(**kwargs)  # type: ignore[call-overload]
    with client.messages.stream(**kwargs) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and plain.content[0].type == "text"
    assert final.content[0].text == plain.content[0].text == text
    assert final.stop_reason == plain.stop_reason


def test_count_tokens_matches_usage(client: anthropic.Anthropic) -> None:
    count = client.messages.count_tokens(model=MODEL, messages=ASK)  # type: ignore[arg-type]
    m = client.messages.create(model=MODEL, max_tokens=2, messages=ASK)  # type: ignore[arg-type]
    assert count.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_tool_use_and_tool_result_round_trip(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=ask,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    )
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use"
    assert set(use.input) == {"city"}  # type: ignore[arg-type]
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "18C and sunny"}
    second = client.messages.create(
        model=MODEL,
        max_tokens=60,
        messages=[
            *ask,
            {"role": "assistant", "content": [use.model_dump()]},
            {"role": "user", "content": [result]},
        ],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        extra_body=GREEDY,
    )
    assert second.content and second.content[0].type == "text" and second.content[0].text
    assert second.stop_reason in ("end_turn", "max_tokens")
