"""Tool calls through POST /v1/chat/completions on the FakeEngine: parsed calls, SSE
transcripts that reassemble to the non-streamed message, forced calls, history, and 400s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.agent_helpers import TIME, WEATHER, message_view, reassemble, without_ids
from tests.api.sse_helpers import parse_sse
from tests.conftest import MAX_MODEL_LEN, MODEL
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.tokenizer import Tokenizer

URL = "/v1/chat/completions"
TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
HERMES_REPLY = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "max_model_len": MAX_MODEL_LEN * 8,
            "chat_template": str(TEMPLATES / "hermes.jinja"),
            "max_grammar_bytes": 2000,
        }
    )


@pytest.fixture
def engine_info(engine_info: Any) -> Any:
    from dataclasses import replace

    return replace(engine_info, max_model_len=MAX_MODEL_LEN * 8)


def script(engine: FakeEngine, tokenizer: Tokenizer, text: str) -> None:
    engine.script = tokenizer.encode(text, add_special_tokens=False)


def chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    return {"model": MODEL, "messages": messages, "tools": [WEATHER, TIME], **extra}


async def test_auto_tool_calls(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, HERMES_REPLY)
    r = await client.post(URL, json=chat(max_tokens=200))
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me check."
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    # The tools reached the template, and the guided constraint stays off for auto.
    prompt = tokenizer.decode(fake_engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert '"name": "get_weather"' in prompt and "<tool_call>" in prompt
    assert fake_engine.requests[0].sampling.guided is None
    assert "completion_tokens_details" not in r.json()["usage"]  # no reasoning parser


async def test_streamed_tool_calls_reassemble_to_the_message(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, HERMES_REPLY)
    whole = (await client.post(URL, json=chat(max_tokens=200))).json()
    r = await client.post(URL, json=chat(max_tokens=200, stream=True))
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    assert without_ids(reassemble(events)) == without_ids(message_view(whole))
    deltas = [c["delta"] for e in events[:-1] for c in e["choices"]]
    assert deltas[0] == {"role": "assistant"}  # a call may follow: OpenAI sends no content
    call_deltas = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    first = call_deltas[0][0]
    assert set(first) == {"index", "id", "type", "function"}
    assert first["index"] == 0 and first["function"]["name"] == "get_weather"
    indexes = [c["index"] for d in call_deltas for c in d]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1}
    # Each call: one delta naming it, then its arguments in pieces.
    for index in (0, 1):
        pieces = [c for d in call_deltas for c in d if c["index"] == index]
        assert "id" in pieces[0] and all("id" not in c for c in pieces[1:])
    assert len([c for d in call_deltas for c in d if c["index"] == 0]) > 2
    # No chunk carries the markup: content stops before the call.
    assert all("<tool_call>" not in (d.get("content") or "") for d in deltas)


async def test_parallel_tool_calls_false_keeps_the_first(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, HERMES_REPLY)
    r = await client.post(URL, json=chat(max_tokens=200, parallel_tool_calls=False))
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]


async def test_tool_choice_none_leaves_the_text(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, HERMES_REPLY)
    r = await client.post(URL, json=chat(max_tokens=200, tool_choice="none"))
    (choice,) = r.json()["choices"]
    assert choice["message"] == {"role": "assistant", "content": HERMES_REPLY}
    assert choice["finish_reason"] == "stop"


async def test_malformed_call_falls_back_to_content(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    text = "Sure <tool_call>{not json}</tool_call> done"
    script(fake_engine, tokenizer, text)
    r = await client.post(URL, json=chat(max_tokens=200))
    (choice,) = r.json()["choices"]
    assert choice["message"] == {"role": "assistant", "content": text}
    assert choice["finish_reason"] == "stop"


async def test_named_tool_choice_is_constrained_and_returned_as_call(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    script(fake_engine, tokenizer, '{"city": "Paris"}')
    named = {"type": "function", "function": {"name": "get_weather"}}
    for stream in (False, True):
        r = await client.post(URL, json=chat(max_tokens=50, tool_choice=named, stream=stream))
        assert r.status_code == 200, r.text
        view = reassemble(parse_sse(r.text)) if stream else message_view(r.json())
        (call,) = view["tool_calls"]
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        # OpenAI ends a call forced by name with "stop" (auto / required: "tool_calls")
        assert view["content"] == "" and view["finish_reason"] == "stop"
    guided = fake_engine.requests[0].sampling.guided
    assert guided is not None and guided.kind == "json"
    sent = WEATHER["function"]["parameters"]  # type: ignore[index]
    assert json.loads(guided.spec) == {**sent, "additionalProperties": False}
    assert guided.start_after == ()


async def test_required_tool_choice_schema_and_calls(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    reply = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", '
    script(fake_engine, tokenizer, reply + '"parameters": {}}]')
    r = await client.post(URL, json=chat(max_tokens=100, tool_choice="required", stream=True))
    view = reassemble(parse_sse(r.text))
    assert [c["function"]["name"] for c in view["tool_calls"]] == ["get_weather", "get_time"]
    assert json.loads(view["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    schema = json.loads(fake_engine.requests[0].sampling.guided.spec)  # type: ignore[union-attr]
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    await client.post(
        URL, json=chat(max_tokens=100, tool_choice="required", parallel_tool_calls=False)
    )
    schema = json.loads(fake_engine.requests[1].sampling.guided.spec)  # type: ignore[union-attr]
    assert schema["maxItems"] == 1
    # null, as some clients send it, means the default (parallel calls allowed).
    r = await client.post(
        URL, json=chat(max_tokens=100, tool_choice="required", parallel_tool_calls=None)
    )
    assert r.status_code == 200
    schema = json.loads(fake_engine.requests[2].sampling.guided.spec)  # type: ignore[union-attr]
    assert "maxItems" not in schema


async def test_history_with_tool_calls_reaches_the_template(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    call = {
        "id": "call_abc123def",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_abc123def", "name": "get_weather", "content": "18C"},
    ]
    r = await client.post(URL, json=chat(messages=messages, max_tokens=5))
    assert r.status_code == 200, r.text
    prompt = tokenizer.decode(fake_engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert '<tool_call>\n{ "arguments": {"city": "Paris"}, "name": "get_weather"}' in prompt
    assert '<tool_response>\n{"name": "get_weather", "content": "18C"}' in prompt


BAD = [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required", "tools": None}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    (
        {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        "tools[0].function.name",
    ),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
        "response_format",
    ),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": "start: @@@"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"unknown": 1}}, "structured_outputs.unknown"),
    ({"structured_outputs": {"regex": "a" * 3000}}, "structured_outputs.regex"),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}},
        "structured_outputs.regex",
    ),
    ({"response_format": {"type": "json_object"}, "tool_choice": "required"}, "tool_choice"),
    ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
]


@pytest.mark.parametrize(("extra", "param"), BAD, ids=[p for _, p in BAD])
async def test_bad_agent_requests_are_400_naming_the_param(
    client: httpx.AsyncClient, fake_engine: FakeEngine, extra: dict[str, Any], param: str
) -> None:
    r = await client.post(URL, json=chat(max_tokens=5, **extra))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "BadRequestError"
    assert fake_engine.requests == []


async def test_tools_on_completions_is_400(client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": "hi", "tools": [WEATHER]}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tools"


@pytest.mark.parametrize(
    ("reply", "extra"),
    [
        ('{"city": "Paris"}', {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
        ('[{"name": "get_time", "parameters": {}}]', {"tool_choice": "required"}),
        (HERMES_REPLY.split("Let me check.\n")[1], {"tool_choice": "auto"}),
    ],
)
async def test_streamed_call_content_is_none_as_in_the_message(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer, reply: str, extra: Any
) -> None:
    """The OpenAI SDK's own stream accumulator (`chat.completions.stream`) ends a tool-call
    reply with content None, as the non-streamed message has (OpenAI's first tool-call delta
    carries no content); a text reply still starts with content ""."""
    import openai

    script(fake_engine, tokenizer, reply)
    extra = {**extra}
    if "function" in extra["tool_choice"]:
        extra["tool_choice"]["function"]["name"] = "get_weather"
    sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=client)
    kwargs = chat(max_tokens=200, **extra)
    plain = await sdk.chat.completions.create(**kwargs)
    async with sdk.chat.completions.stream(**kwargs) as stream:
        final = await stream.get_final_completion()
    assert plain.choices[0].message.content is None
    assert final.choices[0].message.content is None
    streamed = final.choices[0].message.tool_calls or ()
    streamed_calls = [
        {"name": f.name, "arguments": f.arguments} for f in (c.function for c in streamed)
    ]
    plain_calls = [c.function.model_dump() for c in plain.choices[0].message.tool_calls or ()]
    assert streamed_calls == plain_calls and plain_calls
    script(fake_engine, tokenizer, "Sunny.")
    r = await client.post(URL, json={**chat(max_tokens=5, tool_choice="none"), "stream": True})
    first = parse_sse(r.text)[0]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": ""}
