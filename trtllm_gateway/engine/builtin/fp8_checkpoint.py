"""Reading an FP8 checkpoint as it is: e4m3 weights with their scales, and KV-cache scales.

Two exporters' layouts, the ones vLLM and TensorRT-LLM read: NVIDIA ModelOpt
(nvidia/Llama-3.1-8B-Instruct-FP8: `*.weight` F8_E4M3 with a scalar `*.weight_scale` and
`*.input_scale`; KV scales as `self_attn.k_proj.k_scale` / `self_attn.v_proj.v_scale`) and
compressed-tensors (RedHatAI/...-FP8: `*.weight_scale` scalar or [N, 1] per channel; KV scales as
`self_attn.k_scale` / `self_attn.v_scale`; the older single `self_attn.kv_scale` sets both). The
names are those vLLM's model_loader/weight_utils.py maybe_remap_kv_scale_name accepts. A weight's
scale may come after it in the files, so the
e4m3 tensors are held (one byte a weight, on the host) until every tensor has been read; then the
model gets them dequantized (its dense weights) and --quantization fp8 gets the e4m3 bytes and
per-row scales as they are (fused projections: the shards' rows with their own scales).
Block-wise FP8 (`weight_scale_inv`, 128x128 blocks) is refused, as are static activation scales
used as such: activations are quantized per token when the step runs (`input_scale` is read and
dropped).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from trtllm_gateway.engine.builtin.fp8 import FP8
from trtllm_gateway.engine.builtin.model import canonical_name, packed_target
from trtllm_gateway.engine.builtin.model_config import ModelConfig

Given = dict[str, tuple[torch.Tensor, torch.Tensor]]  # module -> (e4m3 [N, K], scales [N])


class Fp8CheckpointError(ValueError):
    pass


class Fp8Checkpoint:
    """Filters a checkpoint's (name, tensor) stream; what it held back is read after."""

    def __init__(self) -> None:
        self._weights: dict[str, torch.Tensor] = {}  # "...q_proj.weight" -> e4m3
        self._scales: dict[str, torch.Tensor] = {}  # "...q_proj.weight" -> float32 scale
        self.kv_scales: dict[int, dict[str, float]] = {}  # layer -> {"k": s, "v": s}

    @property
    def is_fp8(self) -> bool:
        return bool(self._weights)

    def read(
        self, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Dense tensors pass through; e4m3 weights come out dequantized once all were read."""
        for name, t in tensors:
            if name.endswith(".weight_scale_inv"):
                raise Fp8CheckpointError(
                    f"{name}: block-wise FP8 checkpoints (weight_scale_inv) are not supported; "
                    "use a per-tensor or per-channel FP8 checkpoint, or a bf16 one"
                )
            if name.endswith(".weight_scale"):
                self._scales[name.removesuffix("_scale")] = t.float()
            elif name.endswith((".input_scale", ".output_scale")):
                continue
            elif name.endswith((".k_scale", ".v_scale", ".kv_scale")):
                self._kv_scale(name, t)
            elif t.dtype == FP8:
                self._weights[name] = t
            else:
                yield name, t
        for name, q in self._weights.items():
            scale = self._row_scales(name, q)
            yield name, q.float() * scale[:, None]  # the model rounds it to its dtype

    def _row_scales(self, name: str, q: torch.Tensor) -> torch.Tensor:
        scale = self._scales.get(name)
        if scale is None:
            raise Fp8CheckpointError(f"{name} is FP8 but the checkpoint has no {name}_scale")
        if scale.numel() == 1:
            return scale.reshape(1).expand(q.shape[0]).contiguous()
        if scale.numel() == q.shape[0]:
            return scale.reshape(q.shape[0])
        raise Fp8CheckpointError(
            f"{name}_scale has shape {list(scale.shape)}: per-tensor or per-channel "
            f"([{q.shape[0]}] or [{q.shape[0]}, 1]) scales only"
        )

    def _kv_scale(self, name: str, t: torch.Tensor) -> None:
        parts = name.split(".")
        layer = int(parts[parts.index("layers") + 1])
        value = float(t.float().reshape(-1)[0])
        # The older single kv_scale stands for both (vLLM's weight_utils.maybe_remap_kv_scale_name
        # maps it to k_scale and duplicates it to v_scale).
        for which in "kv" if parts[-1] == "kv_scale" else parts[-1][0]:
            self.kv_scales.setdefault(layer, {})[which] = value

    def given(self, cfg: ModelConfig) -> Given:
        """The held e4m3 weights per module of the model ("layers.0.self_attn.qkv_proj"): a fused
        projection's shards concatenated in row order, each row with its own scale."""
        rows: dict[str, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
        for name, q in self._weights.items():
            param, offset = packed_target(canonical_name(name), cfg)
            module = param.removesuffix(".weight")
            rows.setdefault(module, []).append((offset, q, self._row_scales(name, q)))
        out: Given = {}
        for module, parts in rows.items():
            parts.sort(key=lambda p: p[0])
            out[module] = (torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts]))
        return out
