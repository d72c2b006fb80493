"""Binary wire format for KV blocks moved between sibling instances (version 1).

    b"TGKV" | u32 little-endian header length | header JSON | raw tensor bytes

The header names the layout (model, dtype, block size, kv layout string), the tensor shape
[layers, 2, tokens, kv_heads, head_dim], the byte count and a BLAKE3 checksum of the bytes. The
tensor bytes are never JSON or base64. Engine-agnostic: no torch here.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass

from blake3 import blake3

MAGIC = b"TGKV"
VERSION = 1


class KvWireError(ValueError):
    """A KV blob is malformed, truncated, corrupted or from an incompatible sibling."""


@dataclass(frozen=True, slots=True)
class KvHeader:
    kv_layout: str
    dtype: str
    shape: tuple[int, ...]
    block_size: int
    num_tokens: int
    nbytes: int
    checksum: str
    version: int = VERSION


def encode(header_fields: dict[str, object], data: bytes | memoryview) -> bytes:
    header = KvHeader(
        **header_fields,  # type: ignore[arg-type]
        nbytes=len(data),
        checksum=blake3(data).hexdigest(),
    )
    raw = json.dumps(asdict(header)).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw + data


def decode(
    blob: bytes, expected_layout: str | None = None, verify: bool = True
) -> tuple[KvHeader, memoryview]:
    """The header and payload of a blob; verify=False skips the checksum (a blob our own API
    server already checked)."""
    if blob[:4] != MAGIC or len(blob) < 8:
        raise KvWireError("not a KV blob (bad magic)")
    (hlen,) = struct.unpack("<I", blob[4:8])
    try:
        fields = json.loads(blob[8 : 8 + hlen])
        fields["shape"] = tuple(fields["shape"])
        header = KvHeader(**fields)
    except (ValueError, TypeError, KeyError) as e:
        raise KvWireError(f"bad KV header: {e}") from e
    if header.version != VERSION:
        raise KvWireError(f"KV wire version {header.version}, expected {VERSION}")
    if expected_layout is not None and header.kv_layout != expected_layout:
        raise KvWireError(
            f"sibling KV layout {header.kv_layout!r} does not match ours {expected_layout!r}"
        )
    shape = header.shape
    if len(shape) != 5 or any(not isinstance(d, int) or d < 0 for d in shape) or shape[1] != 2:
        raise KvWireError(f"bad KV shape {list(shape)}: expected [layers, 2, tokens, heads, dim]")
    if shape[2] != header.num_tokens:
        raise KvWireError(f"KV shape holds {shape[2]} tokens, header says {header.num_tokens}")
    data = memoryview(blob)[8 + hlen :]
    if len(data) != header.nbytes:
        raise KvWireError(f"KV payload truncated: {len(data)} of {header.nbytes} bytes")
    if verify and blake3(data).hexdigest() != header.checksum:
        raise KvWireError("KV payload checksum mismatch")
    return header, data
