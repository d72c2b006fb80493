"""A pure decode step's decoder stack in one C++ call (CPU, cpu_kernels/decode_stack.cpp).

With packed float32 weights a batch-1 decode step made about 330 kernel calls from Python (30
layers of two norms, four projections, RoPE with the KV store, attention, SiLU * up), each with
its nn.Module dispatch, reshapes and thread sizing: 3-5 ms of a ~17 ms step on the 2-core EPYC
(issue 36, docs/cpu_step_profile.md). DecodeStack runs the same kernels in the same order from
C++, so its output is the eager forward's bit for bit; LlamaModel.forward takes it for steps whose
rows are all single-token decodes, PACKED_MAX_ROWS at most, and the eager path for the rest
(prefill, mixed steps, image embeddings).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from trtllm_gateway.engine.builtin.attention import AttentionMetadata
from trtllm_gateway.engine.builtin.cpu_threads import POLICY
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.packed_linear import PACKED_MAX_ROWS, PackedLinear


class CpuDecode:
    """The model's decoder stack as one DecodeStack, bound to the runner's KV caches."""

    def __init__(self, stack: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._stack = stack
        self._kv = kv_caches

    def applies(
        self,
        input_ids: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> bool:
        """Whether this step is one the stack runs: single-token decode rows only."""
        t = input_ids.shape[0]
        return (
            kv_caches is self._kv
            and 0 < t <= PACKED_MAX_ROWS
            and meta.num_decodes == t
            and not meta.prefills
            and meta.decode_blocks is not None
            and meta.decode_ctx_lens is not None
        )

    def forward(
        self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        """h: the embedded tokens [T, hidden], used as the residual stream; the final norm of it."""
        cos, sin = rope
        out: torch.Tensor = self._stack.forward(
            h,
            cos,
            sin,
            meta.slot_mapping,
            meta.decode_blocks,
            meta.decode_ctx_lens,
            meta.decode_len,
            POLICY.min_parallel_fmas(),
        )
        return out


def attach_decode_stack(
    model: LlamaModel,
    kernels: ModuleType,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    block_size: int,
    attn_fma_cost: int,
) -> bool:
    """Give the model a CpuDecode when every layer runs the float32 CPU kernels: packed
    projections without int8 activations or biases, the norm, RoPE-store and SiLU kernels, and a
    float32 cache. Returns whether it did."""
    norms: list[torch.Tensor] = []
    qs: list[torch.Tensor] = []
    scales: list[torch.Tensor] = []
    q4_1: list[bool] = []
    caches: list[torch.Tensor] = []
    for layer, (k, v) in zip(model.decoder_layers, kv_caches, strict=True):
        at, mlp = layer.self_attn, layer.mlp
        projections = (at.qkv_proj, at.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if not (
            all(_float_packed(p) for p in projections)
            and layer.input_layernorm.kernel is not None
            and layer.post_attention_layernorm.kernel is not None
            and at.rope_store is not None
            and mlp.silu_mul is not None
            and k.dtype == torch.float32
            and at.hd % 16 == 0
        ):
            return False
        norms += [
            layer.input_layernorm.weight.detach(),
            layer.post_attention_layernorm.weight.detach(),
        ]
        for p in projections:
            assert isinstance(p, PackedLinear)
            qs.append(p.qs)
            scales.append(p.scales)
            q4_1.append(p.kind == "q4_1")
        caches += [k, v]
    if model.norm.kernel is None or not model.decoder_layers:
        return False
    first = model.decoder_layers[0].self_attn
    stack = kernels.DecodeStack(
        norms,
        model.norm.weight.detach(),
        qs,
        scales,
        q4_1,
        caches,
        first.nq,
        first.nkv,
        model.cfg.rms_norm_eps,
        first.scale,
        block_size,
        attn_fma_cost,
    )
    model.cpu_decode = CpuDecode(stack, kv_caches)
    return True


def _float_packed(m: object) -> bool:
    return isinstance(m, PackedLinear) and not m.int8 and m.bias is None
