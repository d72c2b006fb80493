"""The openai SDK's Responses calls, unmodified, against a live gateway on the real default model
(SmolLM2 on the built-in engine): create, stream to the final response, parse with a pydantic
text_format, a function tool forced by grammar and its round trip, max_output_tokens, and a
three-turn previous_response_id chain across two API server processes."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from pydantic import BaseModel

from tests.e2e.server import Server

MODEL = "SmolLM2-135M-Instruct"
_ACCESS = re.compile(r" api-server-(\d) INFO trtllm_gateway\.access \[([^\]]+)\] request ")
QUESTION = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_create_answers(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=60)
    assert r.status == "completed", r
    assert "Paris" in r.output_text
    assert r.usage is not None and r.usage.input_tokens > 10 and r.usage.output_tokens > 0


def test_stream_to_the_final_response_matches_create(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "input": QUESTION, "temperature": 0, "max_output_tokens": 40}
    plain = client.responses.create(**kwargs)  # type: ignore[call-overload]
    deltas = []
    with client.responses.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert final.output_text == plain.output_text == "".join(deltas)
    assert final.id != plain.id and final.id.startswith("resp_")


class Capital(BaseModel):
    country: str
    city: str


def test_parse_with_a_pydantic_text_format(client: openai.OpenAI) -> None:
    r = client.responses.parse(
        model=MODEL, input=QUESTION, text_format=Capital, temperature=0, max_output_tokens=60
    )
    assert isinstance(r.output_parsed, Capital)
    assert r.output_parsed.city  # the grammar made it valid; the meaning is the model's


def test_max_output_tokens_is_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=2)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"


def test_forced_tool_call_and_its_round_trip(client: openai.OpenAI) -> None:
    ask = "What is the weather in Paris?"
    first = client.responses.create(
        model=MODEL,
        input=ask,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
    )
    (call,) = [o for o in first.output if o.type == "function_call"]
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"city"}  # the grammar: declared keys only
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C, sunny"}],
        tools=[WEATHER],  # type: ignore[list-item]
        temperature=0,
        max_output_tokens=60,
    )
    assert second.status in ("completed", "incomplete") and second.output_text


@pytest.fixture(scope="module")
def two_servers(log_dir: Path) -> Iterator[Server]:
    args = ["--num-kv-blocks", "256", "--api-server-count", "2"]
    srv = Server(args=args).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


def test_three_turn_chain_across_two_api_servers(two_servers: Server) -> None:
    """Each turn on a new connection (either process may accept it); chains until one had its
    turns served by both processes (the access log names the process)."""
    crossed = False
    for chain in range(8):
        previous = None
        ids = []
        for turn, text in enumerate(("My name is Ada.", "I live in Paris.", "What is my name?")):
            rid = f"chain-{uuid.uuid4().hex[:8]}-{chain}-{turn}"
            with openai.OpenAI(
                base_url=f"{two_servers.url}/v1", api_key="unused", max_retries=0
            ) as sdk:
                r = sdk.responses.create(
                    model=MODEL,
                    input=text,
                    previous_response_id=previous,
                    temperature=0,
                    max_output_tokens=8,
                    extra_headers={"x-request-id": rid},
                )
            assert r.previous_response_id == previous
            previous = r.id
            ids.append(rid)
        assert r.usage is not None and r.usage.input_tokens > 40  # all three turns in the prompt
        log = wait_logged(two_servers, ids)
        if len({log[rid] for rid in ids}) > 1:
            crossed = True
            break
    assert crossed, "no chain had turns on both API servers"


def wait_logged(srv: Server, rids: list[str]) -> dict[str, int]:
    """request id -> the API server that answered it, from the access log."""
    for _ in range(50):
        assert srv.log_path is not None
        found = {}
        for line in srv.log_path.read_text(errors="replace").splitlines():
            m = _ACCESS.search(line)
            if m:
                found[m.group(2)] = int(m.group(1))
        if all(r in found for r in rids):
            return found
        time.sleep(0.1)
    raise AssertionError(f"not logged: {rids}")


def test_openai_agents_responses_model_runs_a_tool_round_trip(server: Server) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no trace export to OpenAI
    calls: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return f"18C and sunny in {city}"

    sdk = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="forecaster",
        instructions="Answer weather questions with the tool, then answer in one sentence.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=sdk),
        tools=[weather],
        # The first turn must call the tool (forced by grammar); after the tool's output the
        # agent resets tool_choice (reset_tool_choice) and the model answers in text.
        model_settings=ModelSettings(tool_choice="weather", temperature=0, max_tokens=60),
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert len(calls) == 1
    assert isinstance(result.final_output, str) and result.final_output
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"], kinds
    assert kinds[-1] == "message_output_item"
