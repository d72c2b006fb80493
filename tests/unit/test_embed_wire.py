"""embed_wire, the image and embedding frames between sibling instances: what it pins beyond the
round trip and the layout/kind/checksum/truncation refusals in test_vision_wire.py.

- pixels frames (uint8 [h, w, 3]) round-trip, several frames in one body come back in order,
  and an empty body holds no frames;
- each dtype's item size makes the byte count: a shape that does not match its bytes, a
  negative dimension or an unknown dtype is refused on encode and on decode;
- decode refuses with EmbedWireError, naming the fault: a bad or cut magic (also in a later
  frame), a header that is not JSON or lacks/adds fields, another wire version;
- frames are checked one by one as they are read: the good frames before a bad one come out.
"""

from __future__ import annotations

import json
import struct

import pytest

from trtllm_gateway.engine.disagg.embed_wire import (
    MAGIC,
    VERSION,
    EmbedWireError,
    decode_frames,
    encode_frame,
)
from trtllm_gateway.multimodal.embeds import decode_embeds
from trtllm_gateway.multimodal.errors import MediaRejectedError

PIXELS = bytes(range(2 * 3 * 3))  # a 2x3 RGB image


def _frame_with_header(header: dict[str, object], data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw + data


def _header(frame: bytes, nbytes: int) -> dict[str, object]:
    return json.loads(frame[8 : len(frame) - nbytes])  # type: ignore[no-any-return]


def test_pixel_frames_round_trip_in_order() -> None:
    a = encode_frame("pixels", "ha", "uint8", (2, 3, 3), PIXELS)
    b = encode_frame("pixels", "hb", "uint8", (1, 1, 3), memoryview(b"\x01\x02\x03"))
    frames = list(decode_frames(a + b + a, "pixels"))
    assert [f.header.image_hash for f in frames] == ["ha", "hb", "ha"]
    assert bytes(frames[0].data) == PIXELS and bytes(frames[1].data) == b"\x01\x02\x03"
    h = frames[0].header
    assert (h.kind, h.dtype, h.shape, h.nbytes, h.layout, h.version) == (
        "pixels",
        "uint8",
        (2, 3, 3),
        len(PIXELS),
        "",
        VERSION,
    )
    assert list(decode_frames(b"", "pixels")) == []


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [("uint8", (4,), 4), ("float16", (2, 3), 12), ("bfloat16", (3,), 6), ("float32", (2,), 8)],
)
def test_item_sizes(dtype: str, shape: tuple[int, ...], nbytes: int) -> None:
    frame = encode_frame("embeds", "h", dtype, shape, bytes(nbytes))
    assert next(decode_frames(frame, "embeds")).header.nbytes == nbytes
    with pytest.raises(EmbedWireError, match="is not"):
        encode_frame("embeds", "h", dtype, shape, bytes(nbytes + 1))


def test_bad_dtypes_and_shapes_are_refused_on_encode() -> None:
    with pytest.raises(EmbedWireError, match="unsupported dtype 'int64'"):
        encode_frame("embeds", "h", "int64", (1,), bytes(8))
    with pytest.raises(EmbedWireError, match="is not"):
        encode_frame("embeds", "h", "float32", (-1, -2), bytes(8))


def test_bad_dtypes_and_shapes_are_refused_on_decode() -> None:
    good = encode_frame("embeds", "h", "float32", (2,), bytes(8))
    header = _header(good, 8)
    cases: list[tuple[dict[str, object], str]] = [
        ({"dtype": "int64"}, "unsupported dtype"),
        ({"shape": [3]}, "shape \\[3\\] of float32 is not 8 bytes"),
        ({"shape": [-2, -1]}, "is not 8 bytes"),
    ]
    for change, message in cases:
        with pytest.raises(EmbedWireError, match=message):
            list(decode_frames(_frame_with_header({**header, **change}, bytes(8)), "embeds"))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"TGE", "bad magic"),
        (b"TGEM\x05", "bad magic"),  # magic right, header length cut off
        (b"TGKV" + b"\x00" * 12, "bad magic"),  # a KV blob is not an embedding frame
        (MAGIC + struct.pack("<I", 4) + b"{no}", "bad frame header"),
        (MAGIC + struct.pack("<I", 99) + b'{"kind": "embeds"}', "bad frame header"),
    ],
)
def test_malformed_bodies_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(EmbedWireError, match=message):
        list(decode_frames(body, "embeds"))


def test_a_header_missing_or_adding_fields_or_of_another_version_is_refused() -> None:
    good = encode_frame("embeds", "h", "float32", (2,), bytes(8))
    header = _header(good, 8)
    missing = {k: v for k, v in header.items() if k != "checksum"}
    with pytest.raises(EmbedWireError, match="bad frame header"):
        list(decode_frames(_frame_with_header(missing, bytes(8)), "embeds"))
    with pytest.raises(EmbedWireError, match="bad frame header"):
        list(decode_frames(_frame_with_header({**header, "extra": 1}, bytes(8)), "embeds"))
    with pytest.raises(EmbedWireError, match=f"embedding wire version 3, expected {VERSION}"):
        list(decode_frames(_frame_with_header({**header, "version": 3}, bytes(8)), "embeds"))


def test_frames_before_a_bad_one_come_out_first() -> None:
    good = encode_frame("embeds", "h1", "float32", (1,), bytes(4))
    frames = decode_frames(good + b"junk", "embeds")
    assert next(frames).header.image_hash == "h1"
    with pytest.raises(EmbedWireError, match="bad magic"):
        next(frames)


def test_a_client_embedding_of_pixel_bytes_is_refused_at_the_http_edge() -> None:
    """uint8 is a "pixels" dtype: as an image_embeds file it is a 400 before the engine sees it
    (the width, the model's, is checked in the engine core before any step: issue 40)."""
    data = encode_frame("embeds", "x", "uint8", (5, 64), bytes(320), "llava:9:64")
    with pytest.raises(MediaRejectedError, match="float32/float16/bfloat16"):
        decode_embeds(data)
    ok = encode_frame("embeds", "x", "float16", (5, 7), bytes(70), "llava:9:64")
    assert decode_embeds(ok).hash.startswith("embeds-")
