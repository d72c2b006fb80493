"""POST /v1/completions against the FakeEngine: prompt forms, echo, legacy logprobs, streaming."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.sse_helpers import parse_sse
from tests.conftest import MODEL, REPLY
from tests.fake_engine import FakeEngine
from trtllm_gateway.engine.tokenizer import Tokenizer

URL = "/v1/completions"


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hello", **extra}


async def test_text_prompt(client: httpx.AsyncClient, tokenizer: Tokenizer) -> None:
    r = await client.post(URL, json=completion())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == REPLY
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode("Hello"))


async def test_prompt_forms(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode("Hello there")
    for prompt, expected in [
        (["a", "b"], 2),
        (ids, 1),
        ([ids, ids[:2], ids[:1]], 3),
    ]:
        r = await client.post(URL, json=completion(prompt=prompt, n=2))
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        assert [c["index"] for c in choices] == list(range(2 * expected))
    assert fake_engine.requests[-1].prompt_token_ids == tuple(ids[:1])


@pytest.mark.parametrize(
    ("prompt", "param"), [([], "prompt"), ("", "prompt"), ([[10**6]], "prompt"), ([1.5], "prompt")]
)
async def test_bad_prompts(client: httpx.AsyncClient, prompt: Any, param: str) -> None:
    r = await client.post(URL, json=completion(prompt=prompt))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_suffix_and_best_of_rejected(client: httpx.AsyncClient) -> None:
    assert (await client.post(URL, json=completion(suffix="x"))).status_code == 400
    assert (await client.post(URL, json=completion(best_of=3))).status_code == 400


async def test_echo(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=completion(echo=True, max_tokens=3))
    assert r.json()["choices"][0]["text"].startswith("Hello" + "Hello")


async def test_legacy_logprobs(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=completion(logprobs=2, max_tokens=4))
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert lp["text_offset"][0] == 0
    assert lp["text_offset"][1] == len(lp["tokens"][0])
    assert all(tok in top for tok, top in zip(lp["tokens"], lp["top_logprobs"], strict=True))


async def test_echo_with_logprobs_uses_prompt_logprobs(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    r = await client.post(URL, json=completion(prompt="Hello world", echo=True, logprobs=1))
    prompt_len = len(tokenizer.encode("Hello world"))
    assert fake_engine.requests[0].sampling.prompt_logprobs == 1
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None
    assert all(v is not None for v in lp["token_logprobs"][1:])
    assert "".join(lp["tokens"][:prompt_len]) == "Hello world"


async def test_streaming_with_usage(client: httpx.AsyncClient) -> None:
    body = completion(stream=True, stream_options={"include_usage": True})
    r = await client.post(URL, json=body)
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == REPLY
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] > 0


async def test_streaming_echo(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=completion(stream=True, echo=True))
    chunks = parse_sse(r.text)[:-1]
    assert chunks[0]["choices"][0]["text"].startswith("Hello")
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello" + REPLY
