"""Structured outputs and forced tool calls on the real SmolLM2 through the built-in engine, with
the official openai SDK: the constraint holds for every sampled reply, streamed and not.

Uses the session's one server (tests/e2e/conftest.py); schemas are bounded (maxLength, maxItems,
enums, integer ranges) so that every reply ends well inside max_tokens.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import Annotated, Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.e2e.server import Server

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def ask(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


class Climate(StrEnum):
    temperate = "temperate"
    tropical = "tropical"
    arid = "arid"
    polar = "polar"


class Landmark(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a closed schema: the reply ends
    name: str = Field(max_length=24)
    year_built: int = Field(ge=1000, le=2025)


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    climate: Climate
    landmarks: list[Landmark] = Field(max_length=2)
    languages: list[Annotated[str, Field(max_length=16)]] = Field(max_length=2)


def test_parse_returns_a_parsed_pydantic_object(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=ask("Describe Paris as JSON."),
        response_format=City,
        temperature=0.8,
        seed=1,
        max_tokens=800,  # maxLength counts characters; one may take several tokens
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    city = choice.message.parsed
    assert isinstance(city, City)
    assert isinstance(city.climate, Climate)
    assert all(isinstance(landmark, Landmark) for landmark in city.landmarks)


def _bounded_str(n: int = 20) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


SCHEMAS: list[dict[str, Any]] = [
    City.model_json_schema(),
    {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
            "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        },
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "title": _bounded_str(),
            "steps": {"type": "array", "items": _bounded_str(), "minItems": 1, "maxItems": 3},
        },
        "required": ["title", "steps"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"name": _bounded_str(), "admin": {"type": "boolean"}},
                "required": ["name", "admin"],
                "additionalProperties": False,
            },
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["user", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}},
            "required": ["x"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
]


def _schema_request(client: openai.OpenAI, i: int, stream: bool) -> tuple[dict[str, Any], str]:
    schema = SCHEMAS[i % len(SCHEMAS)]
    fmt: Any = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}
    messages = ask("Reply with JSON about a city you like.")
    kwargs: dict[str, Any] = {"temperature": 0.8, "seed": 100 + i, "max_tokens": 800}
    if not stream:
        r = client.chat.completions.create(
            model=MODEL, messages=messages, response_format=fmt, **kwargs
        )
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        return schema, r.choices[0].message.content or ""
    chunks = client.chat.completions.create(
        model=MODEL, messages=messages, response_format=fmt, stream=True, **kwargs
    )
    text, finish = "", None
    for chunk in chunks:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "stop", text
    return schema, text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_fifty_sampled_replies_validate(client: openai.OpenAI, stream: bool) -> None:
    """50 requests at temperature 0.8 over 5 schemas (25 when streamed): every reply validates."""
    count = 50 if not stream else 25
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: _schema_request(client, i, stream), range(count)))
    for schema, text in results:
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_json_object_always_parses(client: openai.OpenAI, stream: bool) -> None:
    """Every reply that ends on its own is one JSON object. A sampled reply may instead run into
    max_tokens inside a long string (which one does depends on the CPU's float rounding): it is
    then cut off, as OpenAI documents for finish_reason "length", but still starts as an object
    and holds no text outside it."""

    def one(i: int) -> tuple[str, str | None]:
        kwargs: dict[str, Any] = {"temperature": 0.8, "seed": i, "max_tokens": 600}
        messages = ask("Give a tiny JSON object with one key.")
        fmt: Any = {"type": "json_object"}
        if not stream:
            r = client.chat.completions.create(
                model=MODEL, messages=messages, response_format=fmt, **kwargs
            )
            return r.choices[0].message.content or "", r.choices[0].finish_reason
        parts = list(
            client.chat.completions.create(
                model=MODEL, messages=messages, response_format=fmt, stream=True, **kwargs
            )
        )
        text = "".join(c.delta.content or "" for p in parts for c in p.choices)
        finish = [c.finish_reason for p in parts for c in p.choices if c.finish_reason]
        return text, finish[-1] if finish else None

    with ThreadPoolExecutor(5) as pool:
        replies = list(pool.map(one, range(5)))
    for text, finish in replies:
        assert finish in ("stop", "length"), (finish, text)
        if finish == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert text.lstrip().startswith("{"), text
    assert sum(finish == "stop" for _, finish in replies) >= 3, replies


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_regex_and_choice_always_match(client: openai.OpenAI, stream: bool) -> None:
    pattern = r"[A-Z][a-z]{2,8} [0-9]{2,4}"
    choices = ["Paris", "London", "Berlin", "Madrid"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"structured_outputs": {"regex": pattern}}, pattern),
        ({"structured_outputs": {"choice": choices}}, "|".join(choices)),
        ({"guided_choice": choices}, "|".join(choices)),
    ]

    def one(i: int) -> tuple[str, str]:
        extra, expected = cases[i % len(cases)]
        kwargs: dict[str, Any] = {"temperature": 0.8, "seed": i, "max_tokens": 20}
        messages = ask("Name a European capital.")
        if not stream:
            r = client.chat.completions.create(
                model=MODEL, messages=messages, extra_body=extra, **kwargs
            )
            return expected, r.choices[0].message.content or ""
        parts = client.chat.completions.create(
            model=MODEL, messages=messages, extra_body=extra, stream=True, **kwargs
        )
        return expected, "".join(c.delta.content or "" for p in parts for c in p.choices)

    with ThreadPoolExecutor(6) as pool:
        for expected, text in pool.map(one, range(12)):
            assert re.fullmatch(expected, text), (expected, text)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_constraint_with_stop_string_n_and_logprobs(client: openai.OpenAI, stream: bool) -> None:
    """The constraint holds beside the other request features: n=3 (a matcher per choice), a
    stop string (matched on the text, after the constrained tokens), logprobs, a seed."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": ask("Name a European capital and a year."),
        # Nothing the model writes unconstrained: digits, a dash, a word, then after the stop.
        "extra_body": {"structured_outputs": {"regex": r"[0-9]{3}-[a-z]{2,8} [A-Z]{2}"}},
        "stop": [" "],
        "n": 3,
        "temperature": 0.8,
        "seed": 7,
        "logprobs": True,
        "max_tokens": 20,
    }
    texts: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    logprobs: dict[int, int] = {}
    if stream:
        for part in client.chat.completions.create(stream=True, **body):
            for c in part.choices:
                texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
                logprobs[c.index] = logprobs.get(c.index, 0) + len(
                    (c.logprobs.content or []) if c.logprobs else []
                )
                finish[c.index] = c.finish_reason or finish.get(c.index)
    else:
        reply = client.chat.completions.create(**body)
        for c in reply.choices:
            texts[c.index] = c.message.content or ""
            finish[c.index] = c.finish_reason
            logprobs[c.index] = len(c.logprobs.content or []) if c.logprobs else 0
    assert sorted(texts) == [0, 1, 2]
    for i, text in texts.items():
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,8}", text), text  # what comes before the stop
        assert finish[i] == "stop"
        assert logprobs[i] >= 1


WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "maxLength": 20}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
NAMED: Any = {"type": "function", "function": {"name": "get_time"}}


def _calls(client: openai.OpenAI, tool_choice: Any, stream: bool, seed: int) -> tuple[Any, Any]:
    """(calls as [(name, arguments text)], finish_reason), from a whole reply or a stream."""
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": ask("What is the weather in Paris, and the time in Tokyo?"),
        "tools": [WEATHER, TIME],
        "tool_choice": tool_choice,
        "temperature": 0.8,
        "seed": seed,
        "max_tokens": 300,
    }
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
        assert choice.message.content is None
        return calls, choice.finish_reason
    by_index: dict[int, list[str]] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or ():
                entry = by_index.setdefault(call.index, ["", ""])
                if call.id:
                    assert call.function and call.function.name and call.type == "function"
                    entry[0] = call.function.name
                entry[1] += (call.function and call.function.arguments) or ""
    return [tuple(by_index[i]) for i in sorted(by_index)], finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_forced_tool_calls_validate(client: openai.OpenAI, tool_choice: Any, stream: bool) -> None:
    for seed in range(3):
        calls, finish = _calls(client, tool_choice, stream, seed)
        if tool_choice == NAMED:
            assert finish == "stop"  # one bounded object: it always ends; OpenAI's reason
            assert [name for name, _ in calls] == ["get_time"]
        elif finish == "length":
            # "required" allows any number of calls: a model may list them until max_tokens;
            # every call before the one cut short must still be valid.
            calls = calls[:-1]
        else:
            assert finish == "tool_calls"
        assert calls, "a forced tool_choice always returns a call"
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), PARAMS[name])


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_streamed_calls_equal_the_whole_reply(client: openai.OpenAI, tool_choice: Any) -> None:
    """Same seed, same reply: the streamed pieces reassemble to the non-streamed calls."""
    whole, finish = _calls(client, tool_choice, stream=False, seed=7)
    streamed, streamed_finish = _calls(client, tool_choice, stream=True, seed=7)
    assert streamed == whole and streamed_finish == finish
    assert whole


def test_one_call_without_parallel_tool_calls(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ask("What is the weather in Paris, and the time in Tokyo?"),
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0.8,
        seed=3,
        max_tokens=150,
    )
    assert len(reply.choices[0].message.tool_calls or ()) == 1


def test_tool_result_round_trip(client: openai.OpenAI) -> None:
    """A call, its result as a `tool` message, and the model's answer over the history."""
    messages: list[Any] = ask("What is the weather in Paris?")
    first = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
    )
    message = first.choices[0].message
    (call,) = message.tool_calls or ()
    messages += [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], max_tokens=30, temperature=0
    )
    choice = answer.choices[0]
    assert choice.message.content and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")


class Place(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)


class GetWeather(BaseModel):
    """Current weather in a place."""

    model_config = ConfigDict(extra="forbid")
    place: Place  # a nested model: the tool's parameters carry $defs
    unit: Literal["celsius", "fahrenheit"]


def test_parse_with_a_pydantic_function_tool(client: openai.OpenAI) -> None:
    """The SDK's strict function tools (as agent SDKs build them): arguments come back parsed."""
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=ask("What is the weather in Paris?"),
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: the list is bounded
        max_tokens=200,
    )
    (call,) = completion.choices[0].message.tool_calls or ()
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)
    named = client.chat.completions.parse(
        model=MODEL,
        messages=ask("What is the weather in Paris?"),
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
        max_tokens=200,
    )
    (call,) = named.choices[0].message.tool_calls or ()
    assert isinstance(call.function.parsed_arguments, GetWeather)


def test_sdk_stream_helper_accumulates_parsed_reply_and_call(client: openai.OpenAI) -> None:
    """The SDK's own stream accumulator (chat.completions.stream) over our deltas: the final
    completion holds the parsed object, and a streamed call's parsed arguments."""
    with client.chat.completions.stream(
        model=MODEL,
        messages=ask("Describe Paris as JSON."),
        response_format=City,
        max_tokens=800,
        seed=2,
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, City)
    with client.chat.completions.stream(
        model=MODEL,
        messages=ask("What is the weather in Paris?"),
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or ()
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert "tool_calls.function.arguments.done" in events


def test_completions_take_structured_outputs(client: openai.OpenAI) -> None:
    pattern = r"[0-9]{3}-[0-9]{4}"
    for stream in (False, True):
        extra = {"structured_outputs": {"regex": pattern}}
        if not stream:
            r = client.completions.create(
                model=MODEL, prompt="Phone:", max_tokens=20, temperature=0.8, extra_body=extra
            )
            text = r.choices[0].text
        else:
            parts = client.completions.create(
                model=MODEL,
                prompt="Phone:",
                max_tokens=20,
                temperature=0.8,
                extra_body=extra,
                stream=True,
            )
            text = "".join(c.text for p in parts for c in p.choices)
        assert re.fullmatch(pattern, text), text
