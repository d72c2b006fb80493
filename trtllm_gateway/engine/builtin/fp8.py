"""FP8 (e4m3) math of --quantization fp8 and --kv-cache-dtype fp8: the one reference.

Weights: one float32 scale per output channel (row of an nn.Linear weight), amax / 448, so each
row uses e4m3's whole range (vLLM's and TensorRT-LLM's per-channel "FP8 weights"). Activations:
one scale per token, computed when the step runs (dynamic per-token quantization; a checkpoint's
static input_scale is not used). KV cache: e4m3 values with one scale per layer for K and one for
V (1.0 unless the checkpoint gives k_scale / v_scale, vLLM's default), so a stored value is
x / scale rounded to e4m3 and reads back as stored * scale.

The CUDA kernels (kernels/fp8_quant.py, kernels/skinny_gemm.py, kernels/fp8_gemm.py,
torch._scaled_mm, the attention kernels) do exactly this arithmetic; on the CPU the functions
below emulate it (tests measure the error on the real default model against float32). Casting
to float8_e4m3fn rounds to nearest even and saturates nothing: the scales keep every value within
+-448 first.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
MIN_SCALE = 1e-12  # an all-zero row keeps a finite scale (its values quantize to 0 anyway)
MIN_CAPABILITY = (8, 9)  # Ada and Hopper have e4m3 tensor cores; torch._scaled_mm needs them


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (e4m3 [N, K], float32 scales [N]); weight ~= q * scale[:, None]."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / E4M3_MAX).clamp(min=MIN_SCALE)
    q = (w / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q, scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (e4m3 [M, K], float32 scales [M, 1]): one dynamic scale per token."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=MIN_SCALE)
    return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """K or V values into the cache's e4m3 with the layer's scale."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


def fake_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """What the FP8 GEMM computes, in x's dtype: both operands rounded to e4m3 with their scales,
    products summed in float32. The CPU emulation, and the GPU tests' reference."""
    xq, xs = quantize_rows(x.reshape(-1, x.shape[-1]))
    out = (xq.float() @ q.float().T) * xs * scale[None, :]
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], q.shape[0])


def unsupported(device: torch.device) -> str | None:
    """Why FP8 cannot run on this device (None: it can)."""
    if device.type != "cuda":
        return (
            f"FP8 needs an NVIDIA GPU of compute capability {MIN_CAPABILITY[0]}."
            f"{MIN_CAPABILITY[1]} or newer (Ada, Hopper, Blackwell); the device is {device.type}"
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (
            f"FP8 needs compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer "
            f"(Ada, Hopper, Blackwell); {name} is {cap[0]}.{cap[1]}"
        )
    return None
