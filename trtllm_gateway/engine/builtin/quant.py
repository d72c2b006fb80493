"""Weight-only int8 for the CPU path (--quantization int8, with bf16 activations).

Each linear layer keeps its bf16/fp32 weight and adds a per-output-channel int8 copy. Steps with
few rows (batch-1-like decode, where reading the weights is the cost) use the int8 copy through
aten's int8 weight-pack matmul, which reads half the bytes of bf16; larger steps keep the dense
matmul, which is faster there on this kind of CPU (docs/benchmarks.md).
"""

from __future__ import annotations

import torch
from torch import nn

from trtllm_gateway.engine.builtin.model import linear_layers

INT8_MAX_ROWS = 4  # at or below this many rows the int8 path wins (measured, bf16 activations)


class Int8Linear(nn.Module):
    """A drop-in for nn.Linear (no bias) with an int8 fast path for small batches."""

    weight_int8: torch.Tensor
    scales: torch.Tensor

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()
        self.weight = linear.weight
        self.bias = linear.bias
        scales = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0
        q = (w.float() / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_int8", q.contiguous(), persistent=False)
        self.register_buffer("scales", scales.to(torch.bfloat16), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        # aten's int8 kernel is fast with bf16 activations only (fp32 ones took 3x longer).
        if rows > INT8_MAX_ROWS or x.dtype != torch.bfloat16:
            return nn.functional.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1]).contiguous()
        out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def quantize_int8(model: nn.Module) -> int:
    """Wrap every nn.Linear of the model in place; returns how many were wrapped."""
    targets = linear_layers(model)
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child))
    return len(targets)
