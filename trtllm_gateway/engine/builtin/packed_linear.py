"""Linear layers whose float32 weights are exactly GGUF block values, kept packed for small steps.

The default model ships as a GGUF file whose projections are Q4_1 and whose embedding (the tied
LM head) is Q8_0; model_source.py dequantizes it to float32, so every 32-weight block of those
matrices is exactly `d * q + m` (Q4_1: fp16 d and m, q in 0..15) or `d * q` (Q8_0: fp16 d, q in
-127..127). The pack_* functions recover d, m and q and check every block bit for bit; a matrix
with one block that does not round-trip stays dense. PackedLinear then multiplies steps of up to
PACKED_MAX_ROWS rows with the block kernels (cpu_kernels/block_gemm.cpp: 0.56 or 1.06 bytes read
per weight instead of 4, float32 arithmetic) and larger steps (prefill) with the dense matmul.
The model's weights are unchanged; only the order of float additions differs from the dense path.

With int8 activations (`--packed-weights int8`) every step, prefill included, quantizes its rows
to int8 per 32-value block and multiplies them by the same blocks with integer dot products
(cpu_kernels/q8_gemm.cpp, llama.cpp's arithmetic): 2-3x faster at 8-128 rows, but the result is
the weights times the quantized activations, so greedy tokens can differ from float32's.
"""

from __future__ import annotations

from collections import Counter
from types import ModuleType
from typing import cast

import torch
from torch import nn

from trtllm_gateway.engine.builtin.cpu_threads import call_sized
from trtllm_gateway.engine.builtin.model import linear_layers
from trtllm_gateway.engine.builtin.pack_cache import Packs

QK = 32  # weights per block
LANES = 16  # output columns per register group of the int8 kernel
PACKED_MAX_ROWS = 64  # at or below this many rows the block kernels win (docs/benchmarks.md)


def _blocks(w: torch.Tensor) -> torch.Tensor | None:
    if w.dim() != 2 or w.dtype != torch.float32 or w.shape[1] % QK:
        return None
    return w.detach().reshape(w.shape[0], -1, QK)


def _fp16_exact(t: torch.Tensor) -> torch.Tensor:
    return t.half().float()


def pack_q4_1(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(qs [N, K/2] uint8, dm [N, K/32, 2]) if w is exactly Q4_1 blocks, else None."""
    b = _blocks(w)
    if b is None:
        return None
    # llama.cpp's quantizer stores m = fp16(min) and gives the minimum q = 0, so m is the block's
    # smallest value; d = fp16((max - min) / 15).
    m = b.amin(-1, keepdim=True)
    d = _fp16_exact((b.amax(-1, keepdim=True) - m) / 15)
    q = torch.where(d > 0, (b - m) / d, 0.0).round().clamp(0, 15)
    if not (torch.equal(_fp16_exact(m), m) and torch.equal(q * d + m, b)):
        return None
    q8 = q.to(torch.uint8)
    qs = q8[..., : QK // 2] | (q8[..., QK // 2 :] << 4)  # byte j: q[j] | q[j + 16] << 4
    return qs.reshape(w.shape[0], -1).contiguous(), torch.cat([d, m], -1).contiguous()


def pack_q8_0(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(qs [N, K] int8, d [N, K/32]) if w is exactly Q8_0 blocks, else None."""
    b = _blocks(w)
    if b is None:
        return None
    d = _fp16_exact(b.abs().amax(-1, keepdim=True) / 127)  # the largest |q| is 127
    q = torch.where(d > 0, b / d, 0.0).round().clamp(-127, 127)
    if not torch.equal(q * d, b):
        return None
    return q.to(torch.int8).reshape(w.shape).contiguous(), d.squeeze(-1).contiguous()


def q8_layout(
    kind: str, packed: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 kernel's layout of packed blocks (q8_gemm.cpp): per group of 16 columns and block,
    8 groups of 4 inputs with each column's 4 unsigned bytes side by side (Q4_1: two groups a byte),
    and the (d, m) pair of every column as [N / 16, blocks, 2, 16] floats."""
    qs, scales = packed
    n = qs.shape[0]
    g = n // LANES
    if kind == "q4_1":
        b = scales.shape[1]
        nib = qs.view(n, b, QK // 2)
        q = torch.cat([nib & 15, nib >> 4], -1)  # [N, B, 32]: q[j], j = 0..31
        q = q.view(g, LANES, b, 8, 4).permute(0, 2, 3, 1, 4)  # [G, B, group, column, 4]
        w = (q[:, :, :4] | (q[:, :, 4:] << 4)).reshape(g, b, 256)
        dm = scales
    else:
        b = qs.shape[1] // QK
        u = (qs.int() + 128).to(torch.uint8)  # unsigned for vpdpbusd; m = -128 d takes it back
        w = u.view(g, LANES, b, 8, 4).permute(0, 2, 3, 1, 4).reshape(g, b, 512)
        dm = torch.stack([scales, -128 * scales], -1)
    return w.contiguous(), dm.view(g, LANES, b, 2).permute(0, 2, 3, 1).contiguous()


class PackedLinear(nn.Module):
    """A drop-in for nn.Linear: block kernels for steps of few rows, the dense weight otherwise."""

    qs: torch.Tensor
    scales: torch.Tensor

    def __init__(
        self,
        linear: nn.Linear,
        kind: str,
        packed: tuple[torch.Tensor, torch.Tensor],
        kernels: ModuleType,
        int8: bool = False,
    ) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.kind = kind
        # int8 activations need whole groups of 16 columns; other shapes keep float32 kernels.
        self.int8 = int8 and linear.out_features % LANES == 0
        self._kernels = kernels
        qs, scales = q8_layout(kind, packed) if self.int8 else packed
        self.register_buffer("qs", qs, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self._mm = kernels.q4_1_mm if kind == "q4_1" else kernels.q8_0_mm
        self._fmas_per_row = linear.out_features * linear.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A batch-1 step makes 120 of these calls: plain ints and the buffer dict, not
        # nn.Module's attribute lookup (its __getattr__ was ~800 calls a step; issue 36).
        cols = x.shape[-1]
        rows = x.numel() // cols
        if rows == 0 or (rows > PACKED_MAX_ROWS and not self.int8):
            return nn.functional.linear(x, self.weight, self.bias)  # float32 models only
        x2 = x.reshape(rows, cols).contiguous()
        buffers = cast("dict[str, torch.Tensor]", self._buffers)  # both registered in __init__
        qs, scales = buffers["qs"], buffers["scales"]
        fmas = rows * self._fmas_per_row
        if self.int8:
            out: torch.Tensor = call_sized(fmas, self._q8, x2, qs, scales)
        else:
            out = call_sized(fmas, self._mm, x2, qs, scales)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def _q8(self, x2: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        qx, xs = self._kernels.quantize_q8(x2)
        out: torch.Tensor = self._kernels.q8_mm(qx, xs, qs, scales, self.kind == "q4_1", False)
        return out

    def extra_repr(self) -> str:
        act = "int8" if self.int8 else "float32"
        return f"{self.kind} x {act}, in={self.weight.shape[1]}, out={self.weight.shape[0]}"


def pack_linears(
    model: nn.Module, kernels: ModuleType, int8: bool = False, known: Packs | None = None
) -> tuple[Counter[str], Packs]:
    """Swap every exactly-packable nn.Linear for a PackedLinear (int8: with int8 activations).

    known: an earlier start's packs of the same weights (pack_cache.py), used where they fit the
    layer's shape instead of packing again. Returns the counts by kind ('dense' = kept) and the
    packs by the layer's qualified name, for the cache."""
    counts: Counter[str] = Counter()
    names = {id(m): n for n, m in model.named_modules()}
    packs: Packs = {}
    for parent, attr, child in linear_layers(model):
        name = f"{names[id(parent)]}.{attr}".lstrip(".")
        if known is not None and name in known and _fits(known[name], child.weight):
            pack = known[name]
        else:
            pack = _pack_one(child.weight)
        packs[name] = pack
        if pack is None:
            counts["dense"] += 1
        else:
            setattr(parent, attr, PackedLinear(child, pack[0], pack[1], kernels, int8))
            counts[pack[0]] += 1
    return counts, packs


def _pack_one(w: torch.Tensor) -> tuple[str, tuple[torch.Tensor, torch.Tensor]] | None:
    for kind, pack in (("q4_1", pack_q4_1), ("q8_0", pack_q8_0)):
        packed = pack(w)
        if packed is not None:
            return kind, packed
    return None


def _fits(pack: tuple[str, tuple[torch.Tensor, torch.Tensor]] | None, w: torch.Tensor) -> bool:
    """A cached pack (or a cached 'dense') that matches the layer's weight shape."""
    if pack is None:
        return True
    n, k = w.shape
    kind, (qs, scales) = pack
    s_shape: tuple[int, ...]
    if kind == "q4_1":
        q_shape, q_dtype, s_shape = (n, k // 2), torch.uint8, (n, k // QK, 2)
    elif kind == "q8_0":
        q_shape, q_dtype, s_shape = (n, k), torch.int8, (n, k // QK)
    else:
        return False
    return (
        tuple(qs.shape) == q_shape
        and qs.dtype == q_dtype
        and tuple(scales.shape) == s_shape
        and scales.dtype == torch.float32
    )
