"""A prefill sibling's KV blob judged before it reaches the engine: its size from our layout, its
header and checksum, and its values finite.

The decode side knows what it asked for: the prompt's tokens in its own KV layout
(`{model}:{layers}x{kv_heads}x{head_dim}:{dtype}:bs{block}`, engine/builtin/loader.py), so the
pull is capped at that size plus a header, and a blob of another shape or holding a NaN or an
infinity is a sibling fault (the request prefills locally) instead of KV in the prefix cache:
before this check a NaN blob was imported, and later local requests sharing the prefix read it
(issue 40, item 6). No torch here: the finite check reads the floats' exponent bits with numpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trtllm_gateway.engine.disagg import kv_wire
from trtllm_gateway.engine.kv_region import KvRegion

# Room for the blob's magic, length and JSON header beyond the tensor bytes.
HEADER_ALLOWANCE = 64 * 1024
_LAYOUT = re.compile(r"^[^:]*:(\d+)x(\d+)x(\d+):(torch\.\w+):bs\d+$")
# dtype -> (itemsize, unsigned view, exponent mask): all exponent bits set is a NaN or an
# infinity; float8_e4m3fn has no infinity and one NaN pattern per sign (S.1111.111).
_FLOATS = {
    "torch.float32": (4, np.uint32, 0x7F800000),
    "torch.float16": (2, np.uint16, 0x7C00),
    "torch.bfloat16": (2, np.uint16, 0x7F80),
    "torch.float8_e4m3fn": (1, np.uint8, 0x7F),
}


@dataclass(frozen=True, slots=True)
class KvShape:
    """What one token's KV is in a layout."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str

    @classmethod
    def of(cls, kv_layout: str) -> KvShape | None:
        """The shape a built-in engine's layout names; None for one it does not parse."""
        m = _LAYOUT.match(kv_layout)
        if m is None or m.group(4) not in _FLOATS:
            return None
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4))

    def tensor(self, num_tokens: int) -> tuple[int, ...]:
        return (self.layers, 2, num_tokens, self.kv_heads, self.head_dim)

    def nbytes(self, num_tokens: int) -> int:
        return 2 * self.layers * num_tokens * self.kv_heads * self.head_dim * self.itemsize

    @property
    def itemsize(self) -> int:
        return _FLOATS[self.dtype][0]


def max_blob_bytes(kv_layout: str, num_tokens: int) -> int | None:
    """The most bytes a pull for num_tokens may take (None: a layout we cannot size)."""
    shape = KvShape.of(kv_layout)
    return None if shape is None else shape.nbytes(num_tokens) + HEADER_ALLOWANCE


def check_blob(blob: bytes, kv_layout: str, num_tokens: int) -> None:
    """KvWireError unless the blob is our layout's KV of exactly num_tokens tokens, intact and
    finite. CPU-bound (a checksum and a pass over the values): run it off the event loop."""
    header, data = kv_wire.decode(blob, expected_layout=kv_layout)
    shape = KvShape.of(kv_layout)
    if shape is None:
        return  # a layout we cannot size: the engine's own import checks stand
    want = shape.tensor(num_tokens)
    if header.shape != want or header.dtype != shape.dtype:
        raise kv_wire.KvWireError(
            f"KV is {list(header.shape)} {header.dtype}, the prompt needs {list(want)} "
            f"{shape.dtype}"
        )
    if len(data) != shape.nbytes(num_tokens):
        raise kv_wire.KvWireError(f"KV holds {len(data)} bytes, {shape.nbytes(num_tokens)} due")
    _, unsigned, exponent = _FLOATS[shape.dtype]
    bits = np.frombuffer(data, dtype=unsigned)
    if np.any((bits & unsigned(exponent)) == unsigned(exponent)):
        raise kv_wire.KvWireError("KV holds NaN or infinite values")


def check_region(region: KvRegion, kv_layout: str, num_tokens: int) -> None:
    """KvWireError unless a staged region's descriptor is our layout's KV of num_tokens tokens
    (its values are checked where they are copied: engine/builtin/kv_staging.py)."""
    if region.kv_layout != kv_layout:
        raise kv_wire.KvWireError(
            f"sibling KV layout {region.kv_layout!r} does not match ours {kv_layout!r}"
        )
    shape = KvShape.of(kv_layout)
    if shape is None:
        raise kv_wire.KvWireError(f"KV layout {kv_layout!r} cannot be sized")
    want = shape.tensor(num_tokens)
    if tuple(region.shape) != want or region.dtype != shape.dtype:
        raise kv_wire.KvWireError(
            f"KV is {list(region.shape)} {region.dtype}, the prompt needs {list(want)} "
            f"{shape.dtype}"
        )
    if region.nbytes != shape.nbytes(num_tokens) or region.offset < 0:
        raise kv_wire.KvWireError(
            f"KV region holds {region.nbytes} bytes, {shape.nbytes(num_tokens)} due"
        )
