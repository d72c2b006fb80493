"""Paged attention over a flat slot-indexed KV cache: metadata, and the portable PyTorch path.

The cache of one layer is [num_slots, kv_heads, head_dim] with slot = block * block_size + offset.
Portable path (CPU): new K/V are written in place first; decode rows then attend over their
gathered blocks in one batched SDPA, and prefill chunks attend per sequence with a causal mask
offset by their context. CUDA path (kernels/): the model sets LlamaModel.ops and the same metadata
carries block tables instead of gathered slots; the Triton kernels read the cache in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PrefillSpan:
    q_start: int
    q_len: int
    ctx_len: int  # tokens of context after this step, this chunk included
    ctx_slots: torch.Tensor | None = (
        None  # [ctx_len] slots; None when the chunk is the whole context
    )
    mask: torch.Tensor | None = None  # [q_len, ctx_len] bool, True = attend


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot of every new token
    num_decodes: int = 0  # the first num_decodes rows are single-token decodes
    decode_blocks: torch.Tensor | None = None  # [B, nb] cache blocks per decode row (portable)
    block_size: int = 0  # tokens per cache block (portable decode gathers whole blocks)
    decode_len: int = 0  # longest decode context: gathered blocks are cut to it (portable)
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, decode_len] additive; None if lens equal
    decode_ctx_lens: torch.Tensor | None = None  # [B] int32 (kernels use it)
    decode_block_tables: torch.Tensor | None = None  # [B, max_blocks] int32 (kernels use it)
    decode_splits: int = 1  # split-KV programs per (sequence, kv head) (kernels)
    prefills: list[PrefillSpan] = field(default_factory=list)
    prefill: KernelPrefill | None = None  # the packed prefill rows (kernels)


@dataclass(slots=True)
class KernelPrefill:
    """Packed prefill rows for the Triton kernel; row i of each tensor is one prefilling seq."""

    block_tables: torch.Tensor  # [P, max_blocks] int32
    ctx_lens: torch.Tensor  # [P] int32, context after this step
    q_starts: torch.Tensor  # [P] int32, first packed query row
    q_lens: torch.Tensor  # [P] int32
    tiles: torch.Tensor  # [2 * n_tiles] int32 (row, first query of the tile)


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    k_cache.index_copy_(0, slots, k)
    v_cache.index_copy_(0, slots, v)


DecodeFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, float], torch.Tensor
]


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    decode: DecodeFn | None = None,
    kv_written: bool = False,
) -> torch.Tensor:
    """q: [T, Hq, D]; k, v: [T, Hk, D] for the new tokens. Returns [T, Hq, D].

    decode: how decode rows attend (default: gathered blocks and SDPA; the loader passes the
    CPU kernel of cpu_kernels/ where it is built, see decode_kernel). kv_written: the caller
    already stored k and v at meta.slot_mapping (the CPU rope_store kernel does)."""
    if not kv_written:
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    decode = decode or _decode_attention
    nd = meta.num_decodes
    if nd and not meta.prefills:  # a pure decode step needs no packing of the output
        return decode(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    if nd:
        out[:nd] = decode(q[:nd], k_cache, v_cache, meta, scale)
    for span in meta.prefills:
        rows = slice(span.q_start, span.q_start + span.q_len)
        qq = q[rows].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        if span.ctx_slots is None:
            kk, vv = k[rows], v[rows]
        else:
            kk, vv = k_cache[span.ctx_slots], v_cache[span.ctx_slots]
        o = F.scaled_dot_product_attention(
            qq,
            kk.transpose(0, 1).unsqueeze(0),
            vv.transpose(0, 1).unsqueeze(0),
            attn_mask=span.mask,
            is_causal=span.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[rows] = o.squeeze(0).transpose(0, 1)
    return out


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """One query row per sequence over its gathered context; q: [B, Hq, D]."""
    kk, vv = _gather(k_cache, meta), _gather(v_cache, meta)
    if q.dtype != torch.float32:
        # bf16 keeps one query row per head: the kernel rounds multi-row problems differently,
        # which flipped greedy tokens against the one-row form (same error against fp64).
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2), kk, vv, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
        )
        return o.squeeze(2)
    b, hq, d = q.shape
    hk = kk.shape[1]
    # GQA as query rows: the hq // hk heads that share a KV head attend as that head's queries,
    # so SDPA runs B * Hk problems of several rows instead of B * Hq single-row ones (~5% of a
    # step at batch 8 and 32).
    o = F.scaled_dot_product_attention(
        q.reshape(b, hk, hq // hk, d), kk, vv, attn_mask=meta.decode_mask, scale=scale
    )
    return o.reshape(b, hq, d)


def decode_kernel(kernels: ModuleType) -> DecodeFn:
    """Decode rows through the compiled float32 kernel (the loader uses it for float32 models
    only): the cache is read in place through the block table, no gathered copy, no mask."""

    def decode(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        blocks, lens = meta.decode_blocks, meta.decode_ctx_lens
        out: torch.Tensor = kernels.decode_attention(
            q.contiguous(), k_cache, v_cache, blocks, lens, meta.block_size, scale
        )
        return out

    return decode


def _gather(cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """Each decode row's context as a [B, Hk, decode_len, D] view; cache: [slots, Hk, D]."""
    assert meta.decode_blocks is not None
    b, nb = meta.decode_blocks.shape
    _, hk, d = cache.shape
    # Gather whole blocks, not slots: one long row copy per block instead of one per token.
    rows = cache.view(-1, meta.block_size * hk * d).index_select(0, meta.decode_blocks.flatten())
    ctx = rows.view(b, nb * meta.block_size, hk, d)[:, : meta.decode_len]
    return ctx.transpose(1, 2)


def causal_offset_mask(q_len: int, ctx_len: int, device: torch.device) -> torch.Tensor:
    """Row i (absolute position ctx_len - q_len + i) may attend to columns 0..that position."""
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (ctx_len - q_len)
    return torch.arange(ctx_len, device=device).unsqueeze(0) <= rows
