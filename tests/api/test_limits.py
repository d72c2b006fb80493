"""Request bodies and prompt text are bounded before they are buffered or tokenized (issue 24,
item 5): a body past --max-body-bytes is a 413 (declared or chunked), and text no context could
hold is a 400 before the chat template or the tokenizer sees it (10 MB took 85 s to tokenize)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.api.ops_helpers import CHAT, serve
from tests.conftest import MAX_MODEL_LEN, MODEL
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.schemas import ChatCompletionRequest
from trtllm_gateway.routers.openai.validation import MAX_CHARS_PER_TOKEN, check_values
from trtllm_gateway.web.errors import BadRequestError

LIMIT = 4096


async def chunks(total: int) -> AsyncIterator[bytes]:
    for _ in range(total // 1024):
        yield b"x" * 1024


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_past_the_limit_is_a_413(
    settings: Settings, fake_engine: FakeEngine, chunked: bool
) -> None:
    async with serve(settings, fake_engine, max_body_bytes=LIMIT) as (_, client):
        body: Any = chunks(64 * 1024) if chunked else b"x" * (64 * 1024)
        r = await client.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        assert r.status_code == 413, r.text
        assert r.json()["error"]["message"]  # OpenAI-shaped
        ok = await client.post("/v1/chat/completions", json=CHAT)  # the next one is served
        assert ok.status_code == 200, ok.text


@pytest.fixture
def no_tokenizing(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def refuse(self: Tokenizer, *args: object, **kw: object) -> list[int]:
        calls.append(1)
        raise AssertionError("text past any context must not be tokenized")

    monkeypatch.setattr(Tokenizer, "encode", refuse)
    monkeypatch.setattr(Tokenizer, "encode_chat", refuse)
    return calls


@pytest.mark.parametrize("route", ["chat", "completions"])
async def test_text_no_context_could_hold_is_refused_untokenized(
    client: httpx.AsyncClient, no_tokenizing: list[int], route: str
) -> None:
    text = "word " * (MAX_MODEL_LEN * MAX_CHARS_PER_TOKEN // 5 + 1)
    if route == "chat":
        path, body = (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": text}]},
        )
    else:
        path, body = "/v1/completions", {"model": MODEL, "prompt": text}
    r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert no_tokenizing == []


def test_image_part_urls_are_not_prompt_text() -> None:
    """Issue 40 item 7: an image_embeds data: URL of a real model's embedding (576 x 4096 fp16:
    6.3 M base64 characters) counted as prompt text, so the documented way to send one was a
    context_length_exceeded on any model. Image parts' URLs are exempt (their own bounds:
    --max-image-bytes, the context once expanded); the same characters as text are not."""
    limit = MAX_MODEL_LEN * MAX_CHARS_PER_TOKEN
    url = "data:application/octet-stream;base64," + "A" * (limit + 4)
    parts = [
        {"type": "image_embeds", "image_embeds": {"url": url}},
        {"type": "image_embeds", "image_embeds": url},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "describe"},
    ]
    body = ChatCompletionRequest.model_validate(
        {**CHAT, "messages": [{"role": "user", "content": parts}]}
    )
    check_values(body, limit)
    as_text = ChatCompletionRequest.model_validate(
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": url}]}]}
    )
    with pytest.raises(BadRequestError) as info:
        check_values(as_text, limit)
    assert info.value.code == "context_length_exceeded"
    # Only the URL of an image part: the same key elsewhere (an unknown field) is text.
    smuggled = ChatCompletionRequest.model_validate(
        {**CHAT, "messages": [{"role": "user", "content": "hi", "image_embeds": url}]}
    )
    with pytest.raises(BadRequestError):
        check_values(smuggled, limit)
