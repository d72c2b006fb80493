"""Batched sampling on the GPU: greedy or Gumbel-max, one program per row, no host sync.

A row with temperature 0 takes the argmax. Otherwise it takes argmax(logits / T + Gumbel noise),
which draws from softmax(logits / T). The noise is Philox (tl.rand) keyed by a per-row 64-bit key
and the column, so a row's draw depends only on its key: hash the request seed with the decode
step on the host and a seeded request samples the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_gateway.engine.builtin.sample_keys import row_key as row_key


# The temperatures and keys are slices of one packed buffer (sampler._draw_on_device): at an odd
# row count, or at a pinned ring's offset, they are not 16-byte aligned, and Triton compiled a
# second variant for that the first time it happened mid-serving (~0.2 s of the core's thread,
# py-spy of a 135M core on an H200, 2026-11-29). They are read once a program: no alignment to
# gain from.
@triton.jit(do_not_specialize_on_alignment=["temps_ptr", "keys_ptr"])
def _sample_partial_kernel(
    logits_ptr,
    stride,
    temps_ptr,
    keys_ptr,
    val_ptr,
    idx_ptr,
    vocab,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    """Program (row, chunk): the best perturbed logit of CHUNK columns and its column."""
    r = tl.program_id(0)
    part = tl.program_id(1)
    temp = tl.load(temps_ptr + r)
    key = tl.load(keys_ptr + r)
    base = logits_ptr + r.to(tl.int64) * stride
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    cols = tl.arange(0, BLOCK)
    inv_t = 1.0 / tl.where(temp > 0, temp, 1.0)
    for v0 in range(part * CHUNK, tl.minimum((part + 1) * CHUNK, vocab), BLOCK):
        c = v0 + cols
        mask = c < vocab
        x = tl.load(base + c, mask=mask, other=float("-inf")).to(tl.float32)
        if temp > 0:
            u = tl.maximum(tl.rand(key, c), 1e-20)
            x = x * inv_t - tl.log(-tl.log(u))
        x = tl.where(mask & (x == x), x, float("-inf"))  # NaN never wins
        take = x > best
        best = tl.where(take, x, best)
        best_idx = tl.where(take, c, best_idx)
    top = tl.max(best, 0)
    idx = tl.min(tl.where(best == top, best_idx, 2147483647), 0)
    nparts = tl.num_programs(1)
    tl.store(val_ptr + r * nparts + part, top)
    tl.store(idx_ptr + r * nparts + part, idx)


@triton.jit
def _sample_reduce_kernel(val_ptr, idx_ptr, out_ptr, PARTS: tl.constexpr, P_PAD: tl.constexpr):
    r = tl.program_id(0)
    p = tl.arange(0, P_PAD)
    pm = p < PARTS
    v = tl.load(val_ptr + r * PARTS + p, mask=pm, other=float("-inf"))
    i = tl.load(idx_ptr + r * PARTS + p, mask=pm, other=2147483647)
    top = tl.max(v, 0)
    tl.store(out_ptr + r, tl.min(tl.where(v == top, i, 2147483647), 0).to(tl.int64))


CHUNK = 8192


def sample(logits: torch.Tensor, temps: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """logits: [R, V] float32, or bf16 / fp16 (read as float32: the same draws as from their
    float copy); temps: [R] (0 = greedy); keys: [R] int64. Returns [R] int64.

    Each row is split over ceil(V / 8192) programs, so a batch of one still fills many SMs.
    """
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        parts = triton.cdiv(vocab, CHUNK)
        vals = torch.empty((rows, parts), dtype=torch.float32, device=logits.device)
        idxs = torch.empty((rows, parts), dtype=torch.int32, device=logits.device)
        _sample_partial_kernel[(rows, parts)](
            logits,
            logits.stride(0),
            temps,
            keys,
            vals,
            idxs,
            vocab,
            CHUNK=CHUNK,
            BLOCK=1024,
            num_warps=4,
        )
        _sample_reduce_kernel[(rows,)](
            vals, idxs, out, PARTS=parts, P_PAD=max(2, triton.next_power_of_2(parts)), num_warps=1
        )
    return out


def compile_for(
    vocab: int, device: torch.device, dtypes: tuple[torch.dtype, ...] = (torch.float32,)
) -> None:
    """Compile both kernels for this vocabulary and each logits dtype when the engine starts,
    not in the first request's step. Temperatures and keys at any alignment then launch the
    same variant."""
    packed = torch.zeros(12, dtype=torch.uint8, device=device)
    for dtype in dict.fromkeys(dtypes):
        logits = torch.zeros((1, vocab), dtype=dtype, device=device)
        sample(logits, packed[8:].view(torch.float32), packed[:8].view(torch.int64))
