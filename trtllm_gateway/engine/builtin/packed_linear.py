"""Linear layers whose float32 weights are exactly GGUF block values, kept packed for small steps.

The default model ships as a GGUF file whose projections are Q4_1 and whose embedding (the tied
LM head) is Q8_0; model_source.py dequantizes it to float32, so every 32-weight block of those
matrices is exactly `d * q + m` (Q4_1: fp16 d and m, q in 0..15) or `d * q` (Q8_0: fp16 d, q in
-127..127). The pack_* functions recover d, m and q and check every block bit for bit; a matrix
with one block that does not round-trip stays dense. PackedLinear then multiplies steps of up to
PACKED_MAX_ROWS rows with the block kernels (cpu_kernels/block_gemm.cpp: 0.56 or 1.06 bytes read
per weight instead of 4, float32 arithmetic) and larger steps (prefill) with the dense matmul.
The model's weights are unchanged; only the order of float additions differs from the dense path.
"""

from __future__ import annotations

from collections import Counter
from types import ModuleType

import torch
from torch import nn

from trtllm_gateway.engine.builtin.model import linear_layers

QK = 32  # weights per block
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
    ) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.kind = kind
        self.register_buffer("qs", packed[0], persistent=False)
        self.register_buffer("scales", packed[1], persistent=False)
        self._mm = kernels.q4_1_mm if kind == "q4_1" else kernels.q8_0_mm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows > PACKED_MAX_ROWS or rows == 0:  # the loader packs float32 models only
            return nn.functional.linear(x, self.weight, self.bias)
        out: torch.Tensor = self._mm(
            x.reshape(rows, x.shape[-1]).contiguous(), self.qs, self.scales
        )
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def extra_repr(self) -> str:
        return f"{self.kind}, in={self.weight.shape[1]}, out={self.weight.shape[0]}"


def pack_linears(model: nn.Module, kernels: ModuleType) -> Counter[str]:
    """Swap every exactly-packable nn.Linear for a PackedLinear; counts by kind ('dense' = kept)."""
    counts: Counter[str] = Counter()
    targets = linear_layers(model)
    for parent, name, child in targets:
        for kind, pack in (("q4_1", pack_q4_1), ("q8_0", pack_q8_0)):
            packed = pack(child.weight)
            if packed is not None:
                setattr(parent, name, PackedLinear(child, kind, packed, kernels))
                counts[kind] += 1
                break
        else:
            counts["dense"] += 1
    return counts
