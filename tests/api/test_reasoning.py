"""--reasoning-parser through POST /v1/chat/completions on the FakeEngine: reasoning_content
(and the `reasoning` alias), streamed deltas, reasoning token usage, and constraints that start
after the reasoning."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.agent_helpers import message_view, reassemble
from tests.api.sse_helpers import parse_sse
from tests.conftest import MODEL
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.tokenizer import Tokenizer

URL = "/v1/chat/completions"
REPLY = "<think>\nThe capital of France.\n</think>\n\nParis."


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"reasoning_parser": "qwen3"})


def chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Capital of France?"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 100, **extra}


@pytest.fixture
def scripted(fake_engine: FakeEngine, tokenizer: Tokenizer) -> list[int]:
    fake_engine.script = tokenizer.encode(REPLY, add_special_tokens=False)
    return list(fake_engine.script)  # type: ignore[arg-type]


async def test_reasoning_content_and_usage(
    client: httpx.AsyncClient, scripted: list[int], tokenizer: Tokenizer
) -> None:
    r = await client.post(URL, json=chat())
    assert r.status_code == 200, r.text
    body = r.json()
    (choice,) = body["choices"]
    assert choice["message"] == {
        "role": "assistant",
        "content": "Paris.",
        "reasoning_content": "\nThe capital of France.\n",
        "reasoning": "\nThe capital of France.\n",
    }
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    # One token per event: the tokens generated inside the block, from the first after the
    # complete `<think>` through the one that completes `</think>`.
    thinking = tokenizer.encode("<think>\nThe capital of France.\n</think>", False)
    start = tokenizer.encode("<think>", False)
    assert thinking[: len(start)] == start  # the tag tokenizes alike alone and in the reply
    reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"]
    assert reasoning_tokens == len(thinking) - len(start)
    assert usage["completion_tokens"] == len(scripted) + 1  # + EOS


async def test_streamed_reasoning_transcript(
    client: httpx.AsyncClient, scripted: list[int]
) -> None:
    whole = (await client.post(URL, json=chat())).json()
    options = {"include_usage": True}
    r = await client.post(URL, json=chat(stream=True, stream_options=options))
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    assert reassemble(events) == message_view(whole)
    deltas = [c["delta"] for e in events[:-1] for c in e["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    thinking = [d for d in deltas if "reasoning_content" in d]
    assert thinking and all(d["reasoning"] == d["reasoning_content"] for d in thinking)
    assert all("content" not in d for d in thinking)  # no empty content next to reasoning
    assert all("<think>" not in (d.get("content") or "") for d in deltas)
    assert (
        events[-2]["usage"]["completion_tokens_details"]
        == (whole["usage"]["completion_tokens_details"])
    )


async def test_reply_without_thinking_is_content(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    fake_engine.script = tokenizer.encode("Paris.", add_special_tokens=False)
    body = (await client.post(URL, json=chat())).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris."}
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


async def test_constraint_starts_after_the_reasoning(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer, scripted: list[int]
) -> None:
    await client.post(URL, json=chat(response_format={"type": "json_object"}))
    guided = fake_engine.requests[-1].sampling.guided
    assert guided is not None and guided.kind == "json_object"
    assert guided.start_after == tuple(tokenizer.encode("</think>", add_special_tokens=False))
    off = {"enable_thinking": False}
    await client.post(
        URL, json=chat(response_format={"type": "json_object"}, chat_template_kwargs=off)
    )
    guided = fake_engine.requests[-1].sampling.guided
    assert guided is not None and guided.start_after == ()


async def test_n2_choices_each_split(client: httpx.AsyncClient, scripted: list[int]) -> None:
    r = await client.post(URL, json=chat(n=2))
    choices = r.json()["choices"]
    assert len(choices) == 2
    assert all(c["message"]["reasoning_content"] for c in choices)
