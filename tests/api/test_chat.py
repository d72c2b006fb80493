"""POST /v1/chat/completions against the FakeEngine: statuses, bodies, SSE transcripts."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from tests.api.ops_helpers import post_then_leave
from tests.api.sse_helpers import chat_text, parse_sse
from tests.conftest import MAX_MODEL_LEN, MODEL, REPLY
from tests.fake_engine import FakeEngine
from trtllm_gateway.engine.protocol import OverloadedError
from trtllm_gateway.engine.tokenizer import Tokenizer

URL = "/v1/chat/completions"


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], **extra}


async def test_non_streaming(client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    r = await client.post(URL, json=chat())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": REPLY}
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] is None
    usage = body["usage"]
    prompt = fake_engine.requests[0].prompt_token_ids
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 3}
    assert fake_engine.requests[0].request_id == f"{body['id']}-0"
    assert fake_engine.aborted == []


async def test_chat_template_is_applied(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    await client.post(URL, json=chat())
    text = tokenizer.decode(fake_engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert text == "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"


async def test_streaming_transcript(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=chat(stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["x-accel-buffering"] == "no"
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert chunks[0]["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
            "stop_reason": None,
        }
    ]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chat_text(chunks) == REPLY
    assert all(
        "\ufffd" not in (c["delta"].get("content") or "") for e in chunks for c in e["choices"]
    )
    finish = [c for e in chunks for c in e["choices"] if c["finish_reason"]]
    assert [c["finish_reason"] for c in finish] == ["stop"]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_continuous_usage_stats(client: httpx.AsyncClient) -> None:
    opts = {"include_usage": True, "continuous_usage_stats": True}
    r = await client.post(URL, json=chat(stream=True, stream_options=opts))
    chunks = parse_sse(r.text)[:-1]
    completion = [c["usage"]["completion_tokens"] for c in chunks]
    assert all(c["usage"] is not None for c in chunks)
    assert completion == sorted(completion)
    assert completion[0] == 0


async def test_n_two_streaming_merges_by_index(
    client: httpx.AsyncClient, fake_engine: FakeEngine
) -> None:
    r = await client.post(URL, json=chat(n=2, seed=5, stream=True))
    events = parse_sse(r.text)
    assert [e["choices"][0]["index"] for e in events[:2]] == [0, 1]
    assert all(e["choices"][0]["delta"] == {"role": "assistant", "content": ""} for e in events[:2])
    finishes = sorted(
        c["index"] for e in events[:-1] for c in e["choices"] if c["finish_reason"] == "stop"
    )
    assert finishes == [0, 1]
    ids = sorted(req.request_id for req in fake_engine.requests)
    assert ids == [f"{events[0]['id']}-0", f"{events[0]['id']}-1"]
    assert sorted(req.sampling.seed for req in fake_engine.requests) == [5, 6]
    assert chat_text(events, 0) != chat_text(events, 1)


async def test_n_two_non_streaming(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=chat(n=2))
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["message"]["content"] == REPLY


async def test_max_tokens_gives_length(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=chat(max_completion_tokens=2))
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


async def test_stop_string(client: httpx.AsyncClient, fake_engine: FakeEngine) -> None:
    r = await client.post(URL, json=chat(stop=["world"], stream=True))
    events = parse_sse(r.text)
    assert chat_text(events) == "Hello "
    last = events[-2]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", "world")
    # The renderer stopped iterating, which closed (and so aborted) the engine request.
    assert fake_engine.aborted == [fake_engine.requests[0].request_id]


async def test_stop_token_ids(client: httpx.AsyncClient, reply_ids: list[int]) -> None:
    r = await client.post(URL, json=chat(stop_token_ids=[reply_ids[1]]))
    choice = r.json()["choices"][0]
    assert choice["stop_reason"] == reply_ids[1]
    assert choice["finish_reason"] == "stop"


async def test_logprobs(client: httpx.AsyncClient, tokenizer: Tokenizer) -> None:
    r = await client.post(URL, json=chat(logprobs=True, top_logprobs=3))
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content
    first = content[0]
    assert set(first) == {"token", "logprob", "bytes", "top_logprobs"}
    assert len(first["top_logprobs"]) == 3
    assert first["top_logprobs"][0]["token"] == first["token"]
    assert first["top_logprobs"][-1]["logprob"] == -9999.0
    raw = b"".join(bytes(c["bytes"]) for c in content)
    assert raw.decode() == REPLY + "<|im_end|>"  # logprobs show the EOS token too


async def test_logprobs_streaming(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=chat(logprobs=True, stream=True))
    chunks = parse_sse(r.text)[1:-1]
    entries = [lp for c in chunks for lp in c["choices"][0]["logprobs"]["content"]]
    assert entries
    assert all(e["top_logprobs"] == [] for e in entries)


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        (chat(temperature=5), "temperature"),
        (chat(top_logprobs=2), "top_logprobs"),
        (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
        (chat(best_of=2), "best_of"),
        (chat(messages=[]), "messages"),
        ({"model": MODEL}, "messages"),
        (chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
        (chat(n=0), "n"),
    ],
)
async def test_validation_is_400_with_param(
    client: httpx.AsyncClient, payload: dict[str, Any], param: str
) -> None:
    r = await client.post(URL, json=payload)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "BadRequestError"
    assert error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}


async def test_malformed_json(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"


async def test_unknown_fields_are_ignored(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=chat(some_future_field={"x": 1}))
    assert r.status_code == 200


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=chat(model="nope"))
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NotFoundError"
    assert r.json()["error"]["code"] == "model_not_found"
    sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=client)
    with pytest.raises(openai.NotFoundError):
        await sdk.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}]
        )


async def test_context_too_long(client: httpx.AsyncClient) -> None:
    r = await client.post(URL, json=chat(max_tokens=MAX_MODEL_LEN))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert str(MAX_MODEL_LEN) in error["message"]
    assert "in the prompt" in error["message"]


async def test_engine_error_before_first_token_is_http_status(
    client: httpx.AsyncClient, fake_engine: FakeEngine
) -> None:
    fake_engine.fail_on_generate = OverloadedError("queue full")
    r = await client.post(URL, json=chat(stream=True))
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["message"] == "queue full"


async def test_engine_error_mid_stream_is_error_frame(
    client: httpx.AsyncClient, fake_engine: FakeEngine
) -> None:
    fake_engine.fail_after_tokens = 3
    r = await client.post(URL, json=chat(stream=True))
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "ServiceUnavailableError"


async def test_openai_sdk_streams(client: httpx.AsyncClient) -> None:
    sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=client)
    stream = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == REPLY


async def test_disconnect_before_first_byte_aborts(
    lifespan_app: FastAPI, client: httpx.AsyncClient, fake_engine: FakeEngine
) -> None:
    fake_engine.first_token_delay_s = 30
    await post_then_leave(lifespan_app, URL, json.dumps(chat()).encode())
    assert fake_engine.aborted == [fake_engine.requests[0].request_id]
    assert fake_engine.finished == []
    metrics = (await client.get("/metrics")).text
    assert "trtllm_gateway:http_requests_client_disconnected_total 1.0" in metrics
    assert 'request_success_total{finished_reason="abort"' in metrics
