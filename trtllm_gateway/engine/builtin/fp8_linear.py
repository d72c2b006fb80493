"""Fp8Linear: an nn.Linear whose weight is e4m3 with per-output-channel scales (--quantization fp8).

On CUDA the activations are quantized per token (kernels/fp8_quant.py) and multiplied on the FP8
tensor cores: steps of at most skinny_gemm.MAX_ROWS tokens (decode at small batch, where reading
the weights is the cost) by the skinny kernel, larger ones by fp8_gemm.fp8_matmul (its own e4m3
GEMM where measured faster, else torch._scaled_mm with row-wise scales); all compute
fp8.fake_linear's arithmetic. The fused path (KernelOps) hands them activations already quantized
by the kernel before. Off CUDA, forward is fake_linear itself: what
the CPU tests measure against float32. The dense weight is dropped: the layer
holds one byte a weight.
"""

from __future__ import annotations

import torch
from torch import nn

from trtllm_gateway.engine.builtin import fp8
from trtllm_gateway.engine.builtin.model import linear_layers

SKIP = ("lm_head",)  # the logits stay in the model dtype, as vLLM and TensorRT-LLM keep them


class Fp8Linear(nn.Module):
    weight: torch.Tensor  # e4m3 [N, K]
    weight_scale: torch.Tensor  # float32 [N]

    def __init__(
        self,
        weight: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> None:
        super().__init__()
        assert weight.dtype == fp8.FP8 and scale.shape == (weight.shape[0],)
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("weight_scale", scale.float().contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.out_dtype = out_dtype
        self.out_features, self.in_features = weight.shape

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        q, scale = fp8.quantize_weight(linear.weight.detach())
        return cls(q, scale, linear.bias, linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return fp8.fake_linear(x, self.weight, self.weight_scale, self.bias)
        from trtllm_gateway.engine.builtin.kernels.fp8_gemm import fp8_matmul
        from trtllm_gateway.engine.builtin.kernels.fp8_quant import quantize_rows
        from trtllm_gateway.engine.builtin.kernels.skinny_gemm import MAX_ROWS, skinny_fp8

        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] <= MAX_ROWS:
            out = skinny_fp8(flat.contiguous(), self.weight, self.weight_scale)
            if self.bias is not None:
                out += self.bias
        else:
            xq, xs = quantize_rows(flat.contiguous())
            out = fp8_matmul(xq, xs, self.weight, self.weight_scale, self.out_dtype, self.bias)
        return out.view(*x.shape[:-1], self.out_features)


def quantize_fp8(model: nn.Module, given: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> int:
    """Swap every nn.Linear but the lm_head for an Fp8Linear, in place; returns how many.

    given: FP8 weights read from the checkpoint as they are (module name -> (e4m3, scales [N])),
    used instead of quantizing the dense weight again."""
    names = {id(m): n for n, m in model.named_modules()}
    count = 0
    for parent, attr, child in linear_layers(model):
        name = f"{names[id(parent)]}.{attr}".lstrip(".")
        if attr in SKIP:
            continue
        if name in given:
            q, scale = given[name]
            layer = Fp8Linear(q, scale, child.bias, child.weight.dtype)
        else:
            layer = Fp8Linear.from_linear(child)
        setattr(parent, attr, layer)
        count += 1
    return count
