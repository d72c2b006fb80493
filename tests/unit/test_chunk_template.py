"""routers/openai/chunk_template.py: a pre-rendered chunk is byte for byte what pydantic would
send."""

from __future__ import annotations

import pytest

from trtllm_gateway.routers.openai.chunk_template import TextChunk
from trtllm_gateway.routers.openai.schemas import (
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    CompletionChoice,
    CompletionResponse,
    DeltaMessage,
)

TEXTS = [
    "",
    "plain",
    ' quote " and \\ backslash',
    "new\nline\ttab\r\x00\x01\x1f\x7f",
    "café 你好 😀 \u2028\u2029 \ufffd",
    TextChunk.marker(),  # the marker itself as generated text renders like any other text
]


def completion(text: str) -> CompletionResponse:
    choice = CompletionChoice(index=2, text=text)
    return CompletionResponse(id="cmpl-1", created=7, model="m/é", choices=[choice])


def chat(text: str) -> ChatCompletionChunk:
    choice = ChatCompletionChunkChoice(index=1, delta=DeltaMessage(content=text))
    return ChatCompletionChunk(id="chatcmpl-1", created=7, model="m", choices=[choice])


@pytest.mark.parametrize("build", [completion, chat])
@pytest.mark.parametrize("text", TEXTS)
def test_template_equals_pydantic(build, text: str) -> None:  # type: ignore[no-untyped-def]
    template = TextChunk(build(TextChunk.marker()))
    assert template.render(text) == build(text).model_dump_json().encode()


def test_marker_required_once() -> None:
    with pytest.raises(ValueError, match="marker"):
        TextChunk(completion("no marker"))
