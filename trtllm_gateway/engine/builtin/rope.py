"""Rotary position embeddings (default, linear and Llama 3 scaling), float32 as in HF Llama."""

from __future__ import annotations

import math

import torch

from trtllm_gateway.engine.builtin.model_config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type"))
    if kind == "linear":
        inv = inv / float(cfg.rope_scaling["factor"])
    elif kind == "llama3":
        inv = _llama3(inv, cfg.rope_scaling)
    elif kind is not None:
        raise ValueError(f"rope scaling {kind!r} is not supported")
    return inv


def _llama3(inv: torch.Tensor, s: dict[str, float]) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_mid, mid, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Precomputed cos/sin tables indexed by absolute position."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        t = torch.arange(max_positions, dtype=torch.int64).float()
        freqs = torch.outer(t, inv_frequencies(cfg))
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hk, D]; rotate-half form, as in HF Llama."""
        cos, sin = self.tables(positions)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin [T, 1, D] for `rotate`; gathered once per step, used by every layer.

        The sign of rotate_half's negated half is folded into sin, so rotating needs one roll."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        half = sin.shape[-1] // 2
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin in float32 (bf16 * fp32 promotes exactly), cast back."""
    out = x * cos
    out += x.roll(x.shape[-1] // 2, -1) * signed_sin
    return out.to(x.dtype)
