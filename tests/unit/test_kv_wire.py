"""kv_wire, the KV blob moved between sibling instances: what it pins.

A blob round-trips (header fields, shape as a tuple, the payload bytes as they were, with the
byte count and BLAKE3 checksum filled in), and decode refuses with KvWireError, naming the
fault: a wrong or short magic, a header that is not JSON or lacks/adds fields, another wire
version, a sibling whose KV layout differs from ours, a payload shorter or longer than the
header says, and a payload whose bytes changed.
"""

from __future__ import annotations

import json
import struct

import pytest

from trtllm_gateway.engine.disagg.kv_wire import MAGIC, VERSION, KvWireError, decode, encode

LAYOUT = "llama:L2:H2:D4:bf16:bs4"
FIELDS: dict[str, object] = {
    "kv_layout": LAYOUT,
    "dtype": "bfloat16",
    "shape": (2, 2, 3, 2, 4),
    "block_size": 4,
    "num_tokens": 3,
}
DATA = bytes(range(256)) * 3  # 768 bytes (the wire does not check them against the shape)


def _blob_with_header(header: dict[str, object], data: bytes = DATA) -> bytes:
    raw = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw + data


def _header() -> dict[str, object]:
    return json.loads(encode(FIELDS, DATA)[8 : -len(DATA)])  # type: ignore[no-any-return]


def test_round_trip() -> None:
    header, data = decode(encode(FIELDS, DATA), expected_layout=LAYOUT)
    assert bytes(data) == DATA
    assert header.shape == (2, 2, 3, 2, 4) and header.dtype == "bfloat16"
    assert header.kv_layout == LAYOUT and header.block_size == 4 and header.num_tokens == 3
    assert header.nbytes == len(DATA) and header.version == VERSION
    assert len(header.checksum) == 64
    assert bytes(decode(encode(FIELDS, b""))[1]) == b""  # an empty payload is still a blob


def test_without_an_expected_layout_any_layout_decodes() -> None:
    header, _ = decode(encode({**FIELDS, "kv_layout": "other"}, DATA))
    assert header.kv_layout == "other"


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "bad magic"),
        (b"TGK", "bad magic"),
        (b"TGKV\x01\x00", "bad magic"),  # magic right, header length cut off
        (b"XXXX" + encode(FIELDS, DATA)[4:], "bad magic"),
        (MAGIC + struct.pack("<I", 5) + b"{oops" + DATA, "bad KV header"),
        (MAGIC + struct.pack("<I", 1000) + b'{"kv_layout": 1}', "bad KV header"),
    ],
)
def test_malformed_blobs_are_refused(blob: bytes, message: str) -> None:
    with pytest.raises(KvWireError, match=message):
        decode(blob)


def test_a_header_missing_or_adding_fields_is_refused() -> None:
    missing = _header()
    del missing["checksum"]
    with pytest.raises(KvWireError, match="bad KV header"):
        decode(_blob_with_header(missing))
    extra = {**_header(), "surprise": 1}
    with pytest.raises(KvWireError, match="bad KV header"):
        decode(_blob_with_header(extra))


def test_another_version_is_refused() -> None:
    with pytest.raises(KvWireError, match=f"KV wire version 2, expected {VERSION}"):
        decode(_blob_with_header({**_header(), "version": 2}))


def test_a_sibling_with_another_layout_is_refused() -> None:
    blob = encode(FIELDS, DATA)
    with pytest.raises(KvWireError, match="does not match ours 'llama:L2:H2:D4:fp8:bs4'"):
        decode(blob, expected_layout="llama:L2:H2:D4:fp8:bs4")


def test_a_short_or_long_payload_is_refused() -> None:
    blob = encode(FIELDS, DATA)
    with pytest.raises(KvWireError, match=f"truncated: {len(DATA) - 1} of {len(DATA)} bytes"):
        decode(blob[:-1])
    with pytest.raises(KvWireError, match=f"truncated: {len(DATA) + 1} of {len(DATA)} bytes"):
        decode(blob + b"\x00")


def test_changed_bytes_fail_the_checksum() -> None:
    blob = bytearray(encode(FIELDS, DATA))
    blob[-10] ^= 0xFF
    with pytest.raises(KvWireError, match="checksum mismatch"):
        decode(bytes(blob))


@pytest.mark.parametrize(
    ("shape", "num_tokens", "message"),
    [
        ((2, 2, 3, 2), 3, "bad KV shape"),  # not [layers, 2, tokens, heads, dim]
        ((2, 3, 3, 2, 4), 3, "bad KV shape"),  # not K and V
        ((2, 2, -3, 2, 4), 3, "bad KV shape"),
        ((2, 2, 3, 2, 4), 5, "header says 5"),  # shape and num_tokens disagree
    ],
)
def test_a_shape_that_is_not_a_kv_tensor_is_refused(
    shape: tuple[int, ...], num_tokens: int, message: str
) -> None:
    blob = encode({**FIELDS, "shape": shape, "num_tokens": num_tokens}, DATA)
    with pytest.raises(KvWireError, match=message):
        decode(blob)


def test_a_shape_that_does_not_match_the_byte_count_is_a_wire_error_not_a_crash() -> None:
    """A sibling's shape x dtype that disagrees with its bytes: KvWireError (the engine's
    "remote KV refused" path), not torch's RuntimeError from .view()."""
    from trtllm_gateway.engine.builtin.kv_transfer import decode_kv

    fields = {**FIELDS, "dtype": "torch.bfloat16"}  # the engine names dtypes as torch does
    data = bytes(2 * 2 * 3 * 2 * 4 * 2)  # FIELDS' shape in bf16: 192 bytes
    blob = encode({**fields, "shape": (2, 2, 3, 2, 5)}, data)  # 240 bytes of bf16, 192 sent
    with pytest.raises(KvWireError, match="is 240 bytes, got 192"):
        decode_kv(blob, LAYOUT)
    n, kv = decode_kv(encode(fields, data), LAYOUT)
    assert n == 3 and tuple(kv.shape) == (2, 2, 3, 2, 4)
