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

_MASK64 = (1 << 64) - 1


def row_key(seed: int, step: int) -> int:
    """splitmix64 of (seed, step), folded to a non-negative int63 (Philox takes it as the seed)."""
    z = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


@triton.jit
def _sample_kernel(
    logits_ptr, stride, temps_ptr, keys_ptr, out_ptr, vocab, BLOCK: tl.constexpr
) -> None:
    r = tl.program_id(0)
    temp = tl.load(temps_ptr + r)
    key = tl.load(keys_ptr + r)
    base = logits_ptr + r.to(tl.int64) * stride
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    cols = tl.arange(0, BLOCK)
    inv_t = 1.0 / tl.where(temp > 0, temp, 1.0)
    for v0 in range(0, vocab, BLOCK):
        c = v0 + cols
        mask = c < vocab
        x = tl.load(base + c, mask=mask, other=float("-inf")).to(tl.float32)
        if temp > 0:
            u = tl.rand(key, c)
            u = tl.maximum(u, 1e-20)
            x = x * inv_t - tl.log(-tl.log(u))
        x = tl.where(mask & (x == x), x, float("-inf"))  # NaN never wins
        take = x > best
        best = tl.where(take, x, best)
        best_idx = tl.where(take, c, best_idx)
    top = tl.max(best, 0)
    idx = tl.min(tl.where(best == top, best_idx, 2147483647), 0)
    tl.store(out_ptr + r, idx.to(tl.int64))


def sample(logits: torch.Tensor, temps: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """logits: [R, V] float32; temps: [R] (0 = greedy); keys: [R] int64. Returns [R] int64."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        _sample_kernel[(rows,)](
            logits, logits.stride(0), temps, keys, out, vocab, BLOCK=1024, num_warps=4
        )
    return out
