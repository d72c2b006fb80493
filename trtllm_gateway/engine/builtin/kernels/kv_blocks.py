"""A prompt's KV between the paged cache pool and a contiguous region, every layer in one launch.

The pool is the loader's one tensor [layers, 2, slots, kv_heads, head_dim]; a region is
[layers, 2, tokens, kv_heads, head_dim]. Token t of the prompt lies in slot
block_table[t // block_size] * block_size + t % block_size. One program moves TOKENS tokens of
one (layer, K/V) plane as 32-bit words, so a hand-off is one kernel, not two ops per layer and
K/V issued from Python (issue 41: 256 of them for an 8B prompt). Bytes only: any cache dtype
(bf16, float32, e4m3) moves unchanged.

across() moves a prompt's blocks from a sibling core's pool straight into ours: both sides
paged, the source read in place through its CUDA IPC mapping in our context
(engine/builtin/peer_memory.py). Its address comes as an integer: Triton's launcher refuses a
pointer argument it cannot query from the current device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_blocks_kernel(
    pool_ptr,
    region_ptr,
    table_ptr,
    bad_ptr,
    tokens,
    slots,
    BLOCK_SIZE: tl.constexpr,
    WORDS: tl.constexpr,
    WORDS_PAD: tl.constexpr,
    TOKENS: tl.constexpr,
    TO_POOL: tl.constexpr,
    LANES: tl.constexpr,
    NAN_MASK: tl.constexpr,
) -> None:
    plane = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * TOKENS + tl.arange(0, TOKENS)
    live = t < tokens
    block = tl.load(table_ptr + t // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
    slot = block * BLOCK_SIZE + t % BLOCK_SIZE
    w = tl.arange(0, WORDS_PAD)
    mask = live[:, None] & (w < WORDS)[None, :]
    in_pool = pool_ptr + (plane * slots + slot)[:, None] * WORDS + w[None, :]
    in_region = region_ptr + (plane * tokens + t.to(tl.int64))[:, None] * WORDS + w[None, :]
    if TO_POOL:
        x = tl.load(in_region, mask=mask, other=0)
        tl.store(in_pool, x, mask=mask)
        if NAN_MASK != 0:  # count the NaN / infinite values on the way (issue 40)
            bits: tl.constexpr = 32 // LANES
            bad = tl.zeros_like(x)
            for lane in tl.static_range(LANES):
                bad += (((x >> (lane * bits)) & NAN_MASK) == NAN_MASK).to(tl.int32)
            tl.atomic_add(bad_ptr, tl.sum(tl.sum(bad, axis=1), axis=0))
    else:
        tl.store(in_region, tl.load(in_pool, mask=mask), mask=mask)


@triton.jit
def _kv_across_kernel(
    src_addr,
    dst_ptr,
    src_table_ptr,
    dst_table_ptr,
    bad_ptr,
    tokens,
    src_slots,
    dst_slots,
    BLOCK_SIZE: tl.constexpr,
    WORDS: tl.constexpr,
    WORDS_PAD: tl.constexpr,
    TOKENS: tl.constexpr,
    LANES: tl.constexpr,
    NAN_MASK: tl.constexpr,
) -> None:
    src_ptr = src_addr.to(tl.pointer_type(tl.int32))
    plane = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * TOKENS + tl.arange(0, TOKENS)
    live = t < tokens
    src_block = tl.load(src_table_ptr + t // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
    dst_block = tl.load(dst_table_ptr + t // BLOCK_SIZE, mask=live, other=0).to(tl.int64)
    src_slot = plane * src_slots + src_block * BLOCK_SIZE + t % BLOCK_SIZE
    dst_slot = plane * dst_slots + dst_block * BLOCK_SIZE + t % BLOCK_SIZE
    w = tl.arange(0, WORDS_PAD)
    mask = live[:, None] & (w < WORDS)[None, :]
    x = tl.load(src_ptr + src_slot[:, None] * WORDS + w[None, :], mask=mask, other=0)
    tl.store(dst_ptr + dst_slot[:, None] * WORDS + w[None, :], x, mask=mask)
    bits: tl.constexpr = 32 // LANES
    bad = tl.zeros_like(x)
    for lane in tl.static_range(LANES):
        bad += (((x >> (lane * bits)) & NAN_MASK) == NAN_MASK).to(tl.int32)
    tl.atomic_add(bad_ptr, tl.sum(tl.sum(bad, axis=1), axis=0))


def pool_words(pool: torch.Tensor) -> torch.Tensor:
    """The pool [layers, 2, slots, ...] as [layers * 2, slots, words] of int32 (in place)."""
    layers, two, slots = pool.shape[:3]
    return pool.view(torch.uint8).view(torch.int32).view(layers * two, slots, -1)


# A value whose exponent bits are all ones is NaN or infinite; e4m3 has no infinity, and its
# NaN is S.1111.111.
_NAN_MASKS = {
    torch.float32: (1, 0x7F800000),
    torch.bfloat16: (2, 0x7F80),
    torch.float16: (2, 0x7C00),
    torch.float8_e4m3fn: (4, 0x7F),
}


def move(
    pool: torch.Tensor,
    region: torch.Tensor,
    table: torch.Tensor,
    block_size: int,
    to_pool: bool,
    bad: torch.Tensor | None = None,
) -> None:
    """region [layers, 2, tokens, ...] <-> the pool's slots of the table's blocks.

    pool and region are contiguous on the current GPU, with the same trailing shape and dtype
    (a peer GPU's region is copied here first: Triton refuses a pointer of another device's
    IPC mapping, "cannot be accessed from Triton"). table holds the int32 block ids,
    ceil(tokens / block_size) of them. With bad (one int32 on this GPU), to_pool adds the
    count of NaN / infinite values to it. Enqueued on the current stream."""
    words = pool_words(pool)
    planes, slots, w = words.shape
    tokens = region.shape[2]
    if tokens == 0:
        return
    flat = region.view(torch.uint8).view(torch.int32)
    lanes, nan_mask = _NAN_MASKS[pool.dtype] if bad is not None else (1, 0)
    tile = max(1, min(64, 4096 // triton.next_power_of_2(w)))
    grid = (planes, triton.cdiv(tokens, tile))
    _kv_blocks_kernel[grid](
        words, flat, table, bad if bad is not None else table, tokens, slots,
        BLOCK_SIZE=block_size, WORDS=w, WORDS_PAD=triton.next_power_of_2(w), TOKENS=tile,
        TO_POOL=to_pool, LANES=lanes, NAN_MASK=nan_mask,
    )  # fmt: skip


def across(
    src_addr: int,
    src_slots: int,
    words: torch.Tensor,
    dtype: torch.dtype,
    src_table: torch.Tensor,
    dst_table: torch.Tensor,
    tokens: int,
    block_size: int,
    bad: torch.Tensor,
) -> None:
    """A pool's slots of dst_table's blocks <- a sibling pool's slots of src_table's blocks.

    words: our pool as pool_words() gives it, of cache dtype `dtype`. src_addr: the sibling
    pool's first byte, mapped in this GPU's context; that pool has ours' layout with src_slots
    slots (the caller checked both tables against the sizes). bad (one int32 on this GPU) gets
    the count of NaN / infinite values moved. Enqueued on the current stream."""
    planes, slots, w = words.shape
    if tokens == 0:
        return
    lanes, nan_mask = _NAN_MASKS[dtype]
    tile = max(1, min(64, 4096 // triton.next_power_of_2(w)))
    grid = (planes, triton.cdiv(tokens, tile))
    _kv_across_kernel[grid](
        src_addr, words, src_table, dst_table, bad, tokens, src_slots, slots,
        BLOCK_SIZE=block_size, WORDS=w, WORDS_PAD=triton.next_power_of_2(w), TOKENS=tile,
        LANES=lanes, NAN_MASK=nan_mask,
    )  # fmt: skip
