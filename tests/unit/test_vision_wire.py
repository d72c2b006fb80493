"""Vision plumbing without a model: the embed_wire frames, placeholder expansion and the merge of
image rows into a packed step (chunked prefill slices), the remote encoder's fallback, and where
chat templates want image placeholders."""

from __future__ import annotations

import struct

import httpx
import pytest
import torch

from tests.engine.tiny_llava import CHAT_TEMPLATE
from trtllm_gateway.engine.builtin.vision.placeholders import (
    PlacedImage,
    expand_prompt,
    image_rows,
    merge_images,
)
from trtllm_gateway.engine.disagg.embed_tensors import check_finite
from trtllm_gateway.engine.disagg.embed_wire import (
    EmbedWireError,
    decode_frames,
    encode_frame,
    layout_width,
)
from trtllm_gateway.engine.disagg.remote_encode import RemoteEncoder
from trtllm_gateway.engine.protocol import InvalidRequestError
from trtllm_gateway.engine.tokenizer import content_format

IMG = 9


def test_frames_round_trip_and_are_checked() -> None:
    a = encode_frame("embeds", "h1", "float32", (2, 3), bytes(24), layout="llava:9:3")
    b = encode_frame("embeds", "h2", "float32", (1, 3), bytes(range(12)), layout="llava:9:3")
    frames = list(decode_frames(a + b, "embeds", expected_layout="llava:9:3"))
    assert [f.header.image_hash for f in frames] == ["h1", "h2"]
    assert frames[1].header.shape == (1, 3) and bytes(frames[1].data) == bytes(range(12))
    with pytest.raises(EmbedWireError, match="layout"):
        list(decode_frames(a, "embeds", expected_layout="llava:9:4"))
    with pytest.raises(EmbedWireError, match="expected pixels"):
        list(decode_frames(a, "pixels"))
    with pytest.raises(EmbedWireError, match="checksum"):
        list(decode_frames(a[:-1] + b"\x01", "embeds"))
    with pytest.raises(EmbedWireError, match="truncated"):
        list(decode_frames(a[:-4], "embeds"))
    with pytest.raises(EmbedWireError, match="is not"):
        encode_frame("pixels", "h", "uint8", (2, 2, 3), bytes(5))


def test_expand_prompt_places_each_image() -> None:
    embeds = [torch.ones(3, 2), torch.full((2, 2), 2.0)]
    ids, placed = expand_prompt([1, IMG, 5, IMG, 6], IMG, embeds)
    assert ids == [1, IMG, IMG, IMG, 5, IMG, IMG, 6]
    assert [(p.start, p.end) for p in placed] == [(1, 4), (5, 7)]
    with pytest.raises(InvalidRequestError, match="2 image placeholders but the request carries 1"):
        expand_prompt([IMG, IMG], IMG, embeds[:1])


def test_merge_takes_the_slice_each_chunk_covers() -> None:
    embed = torch.nn.Embedding(16, 2)
    torch.nn.init.zeros_(embed.weight)
    rows = torch.arange(10.0).repeat(2, 1).T  # image rows 0..9, each [r, r]
    images = (PlacedImage(2, rows),)
    # Prefill positions 5..8 of the image sequence, packed at row 1 after another's decode.
    ids = torch.zeros(5, dtype=torch.long)
    h = merge_images(embed, ids, image_rows(images, 5, 4, 1))
    assert h is not None
    assert h[:, 0].tolist() == [0.0, 3.0, 4.0, 5.0, 6.0]  # positions 5..8 are image rows 3..6
    assert image_rows(images, 12, 3, 0) == []  # past the image
    assert merge_images(embed, ids[:3], []) is None


async def test_remote_encoder_falls_back_and_backs_off() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(503, text="loading")

    enc = RemoteEncoder(["http://sib:1"], timeout=5.0, backoff=60.0)
    enc._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    try:
        assert await enc.encode([b""], ["h"], "layout") is None
        assert await enc.encode([b""], ["h"], "layout") is None  # backing off: no call
    finally:
        await enc.aclose()
    assert calls == ["/internal/v1/encode"]
    assert enc.stats.outcomes["local_fallback"] == 2


async def test_remote_encoder_returns_frames_in_order() -> None:
    body = encode_frame("embeds", "h1", "float32", (1, 2), bytes(8), "L") + encode_frame(
        "embeds", "h2", "float32", (1, 2), bytes(8), "L"
    )
    seen: list[httpx.Headers] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, content=body)

    enc = RemoteEncoder(["http://sib:1"], timeout=5.0, backoff=60.0)
    enc._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    try:
        # The request's trace context (--otlp-traces-endpoint) goes along: the encode
        # sibling's span is a child of the request's.
        got = await enc.encode([b"", b""], ["h1", "h2"], "L", (("traceparent", traceparent),))
        assert seen[0]["traceparent"] == traceparent
        assert got is not None and [f.header.image_hash for f in got] == ["h1", "h2"]
        assert await enc.encode([b"", b""], ["h2", "h1"], "L") is None  # other images: refused
    finally:
        await enc.aclose()
    assert enc.stats.outcomes == {"remote": 1, "local_fallback": 1}


def test_content_format_follows_the_template() -> None:
    assert content_format(CHAT_TEMPLATE) == "openai"
    assert content_format("{% for m in messages %}{{ m['content'] }}{% endfor %}") == "string"
    loop = "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}"
    assert content_format(loop) == "openai"


@pytest.mark.parametrize(
    ("dtype", "shape", "why"),
    [
        ("float32", (5, 7), r"\[tokens, 64\]"),
        ("float32", (0, 64), r"\[tokens, 64\]"),
        ("float32", (1, 5, 64), r"\[tokens, 64\]"),
        ("uint8", (5, 64), "float32/float16/bfloat16"),
    ],
)
async def test_a_sibling_answer_the_model_cannot_take_is_encoded_here(
    dtype: str, shape: tuple[int, ...], why: str
) -> None:
    """Issue 40 item 1: a hostile encode sibling's frame under our own layout string, of another
    width, rank or dtype, is the sibling's fault: refused at decode, the images encoded here."""
    layout = "llava:9:64"
    size = {"float32": 4, "uint8": 1}[dtype]
    n = size
    for d in shape:
        n *= d
    # TensorRT-LLM's layout names the width too (engine/trtllm/encode.py embeds_layout).
    for ours in ("trtllm:llava:hidden=64", layout):
        body = encode_frame("embeds", "h1", dtype, shape, bytes(n), ours)
        with pytest.raises(EmbedWireError, match=why):
            list(decode_frames(body, "embeds", expected_layout=ours))

    enc = RemoteEncoder(["http://sib:1"], timeout=5.0, backoff=60.0)
    enc._client = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda _: httpx.Response(200, content=body))
    )
    try:
        assert await enc.encode([b""], ["h1"], layout) is None
    finally:
        await enc.aclose()
    assert enc.stats.outcomes == {"local_fallback": 1}


def test_layout_width() -> None:
    assert layout_width("llava:32000:4096") == 4096
    assert layout_width("trtllm:llava:hidden=4096") == 4096
    assert layout_width("L") is None


async def test_a_sibling_answer_of_nan_is_encoded_here() -> None:
    """Right shape, NaN values: the check the embedders pass (embed_tensors.check_finite) makes
    it the sibling's fault, counted as a local fallback, the sibling marked."""
    nan = struct.pack("<f", float("nan")) * (2 * 64)
    body = encode_frame("embeds", "h1", "float32", (2, 64), nan, "llava:9:64")
    enc = RemoteEncoder(["http://sib:1"], timeout=5.0, backoff=60.0)
    enc._client = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda _: httpx.Response(200, content=body))
    )
    try:
        got = await enc.encode([b""], ["h1"], "llava:9:64")
        assert got is not None  # without the check the frame is well formed
        assert await enc.encode([b""], ["h1"], "llava:9:64", check=check_finite) is None
    finally:
        await enc.aclose()
    assert enc.stats.outcomes == {"remote": 1, "local_fallback": 1}
    assert enc.pool.pick() is None  # marked: backing off
