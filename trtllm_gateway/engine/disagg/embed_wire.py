"""Binary wire format for images and image embeddings between sibling instances (version 1).

A body is a sequence of frames, one per image, each

    b"TGEM" | u32 little-endian header length | header JSON | raw tensor bytes

The header names the kind ("pixels": uint8 RGB [height, width, 3] going to an encode instance;
"embeds": [tokens, hidden] coming back), the image hash, dtype, shape, byte count, a BLAKE3
checksum of the bytes and, for embeddings, the vision layout the receiver must match. Pixels and
embeddings are never JSON or base64. Engine-agnostic: no torch here (kv_wire.py's framing).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Literal

from blake3 import blake3

MAGIC = b"TGEM"
VERSION = 1
CONTENT_TYPE = "application/x-trtllm-gateway-embeds"
FrameKind = Literal["pixels", "embeds"]
_ITEMSIZE = {"uint8": 1, "float32": 4, "float16": 2, "bfloat16": 2}
EMBEDS_DTYPES = ("float32", "float16", "bfloat16")


class EmbedWireError(ValueError):
    """A frame is malformed, truncated, corrupted or from an incompatible sibling."""


@dataclass(frozen=True, slots=True)
class FrameHeader:
    kind: FrameKind
    image_hash: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    checksum: str
    layout: str = ""
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Frame:
    header: FrameHeader
    data: memoryview


def encode_frame(
    kind: FrameKind,
    image_hash: str,
    dtype: str,
    shape: tuple[int, ...],
    data: bytes | memoryview,
    layout: str = "",
) -> bytes:
    header = FrameHeader(
        kind, image_hash, dtype, tuple(shape), len(data), blake3(data).hexdigest(), layout
    )
    _check_size(header)
    raw = json.dumps(asdict(header)).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw + bytes(data)


def decode_frames(
    body: bytes, kind: FrameKind | tuple[FrameKind, ...], expected_layout: str | None = None
) -> Iterator[Frame]:
    """Every frame of a body, checked (magic, version, kind, size, checksum; with an expected
    layout, the layout and the embeddings' shape and dtype: check_embeds); `kind` may name
    several (a request's images mixed with precomputed embeddings)."""
    kinds = (kind,) if isinstance(kind, str) else kind
    view = memoryview(body)
    pos = 0
    while pos < len(view):
        if bytes(view[pos : pos + 4]) != MAGIC or len(view) < pos + 8:
            raise EmbedWireError("not an embedding frame (bad magic)")
        (hlen,) = struct.unpack("<I", view[pos + 4 : pos + 8])
        try:
            fields = json.loads(bytes(view[pos + 8 : pos + 8 + hlen]))
            fields["shape"] = tuple(int(x) for x in fields["shape"])
            header = FrameHeader(**fields)
        except (ValueError, TypeError, KeyError) as e:
            raise EmbedWireError(f"bad frame header: {e}") from e
        if header.version != VERSION:
            raise EmbedWireError(f"embedding wire version {header.version}, expected {VERSION}")
        if header.kind not in kinds:
            raise EmbedWireError(f"expected {'/'.join(kinds)} frames, got {header.kind}")
        if expected_layout is not None and header.layout != expected_layout:
            raise EmbedWireError(
                f"sibling vision layout {header.layout!r} does not match ours {expected_layout!r}"
            )
        _check_size(header)
        if expected_layout is not None and header.kind == "embeds":
            check_embeds(header, expected_layout)
        start = pos + 8 + hlen
        data = view[start : start + header.nbytes]
        if len(data) != header.nbytes:
            raise EmbedWireError(f"frame truncated: {len(data)} of {header.nbytes} bytes")
        if blake3(data).hexdigest() != header.checksum:
            raise EmbedWireError("frame checksum mismatch")
        yield Frame(header, data)
        pos = start + header.nbytes


def layout_width(layout: str) -> int | None:
    """The hidden size a vision layout names: its last field (the built-in engine's
    `llava:32000:4096`, TensorRT-LLM's `trtllm:llava:hidden=4096`); None if it names none."""
    last = layout.rpartition(":")[2].removeprefix("hidden=")
    return int(last) if last.isdigit() else None


def check_embeds(h: FrameHeader, layout: str) -> None:
    """An embedding the model of `layout` (the receiver's own) can take: [tokens >= 1, its
    hidden size] of a float dtype. The sender writes the header's layout string: a [5, 7]
    tensor under a 64-wide model's layout reached the forward pass and killed the engine
    (issue 40), so the shape is checked against the width the receiver's layout names."""
    if h.dtype not in EMBEDS_DTYPES:
        raise EmbedWireError(f"embeddings must be {'/'.join(EMBEDS_DTYPES)}, got {h.dtype}")
    width = layout_width(layout)
    if len(h.shape) != 2 or h.shape[0] < 1 or h.shape[1] != (width or h.shape[1]):
        hidden = "hidden" if width is None else str(width)
        raise EmbedWireError(
            f"embeddings must be [tokens, {hidden}] (the model's hidden size), got {list(h.shape)}"
        )


def _check_size(h: FrameHeader) -> None:
    itemsize = _ITEMSIZE.get(h.dtype)
    if itemsize is None:
        raise EmbedWireError(f"unsupported dtype {h.dtype!r}")
    if any(d < 0 for d in h.shape) or math.prod(h.shape) * itemsize != h.nbytes:
        raise EmbedWireError(f"shape {list(h.shape)} of {h.dtype} is not {h.nbytes} bytes")
