"""The portable paged attention against plain per-sequence attention over the same tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trtllm_gateway.engine.builtin.attention import AttentionMetadata, PrefillSpan, paged_attention

BS, HQ, HK, D = 4, 6, 2, 8


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q: [n, Hq, D] the last n positions of k, v: [L, Hk, D]; causal, in float64."""
    n, length = q.shape[0], k.shape[0]
    mask = torch.arange(length).unsqueeze(0) <= torch.arange(n).unsqueeze(1) + (length - n)
    o = F.scaled_dot_product_attention(
        q.double().transpose(0, 1),
        k.double().transpose(0, 1).repeat_interleave(HQ // HK, 0),
        v.double().transpose(0, 1).repeat_interleave(HQ // HK, 0),
        attn_mask=mask,
    )
    return o.transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens", [(9, 3, 13), (6, 6, 6)])
def test_decodes_and_a_prefill_chunk_match_plain_attention(
    dtype: torch.dtype, lens: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    num_blocks = 32
    k_cache = torch.randn(num_blocks * BS, HK, D, dtype=dtype)
    v_cache = torch.randn(num_blocks * BS, HK, D, dtype=dtype)
    order = torch.randperm(num_blocks).tolist()  # scattered, out-of-order blocks
    prefill_ctx, prefill_new = 10, 3  # a chunk of 3 tokens after 7 cached ones
    ctx_lens = [*lens, prefill_ctx]
    tables, slots = [], []
    for n in ctx_lens:
        nb = -(-n // BS)
        table, order = order[:nb], order[nb:]
        tables.append(table)
        slots.append(torch.tensor([table[i // BS] * BS + i % BS for i in range(n)]))
    new_rows = [s[-1:] for s in slots[:-1]] + [slots[-1][-prefill_new:]]
    t = len(lens) + prefill_new
    q = torch.randn(t, HQ, D, dtype=dtype)
    k, v = torch.randn(t, HK, D, dtype=dtype), torch.randn(t, HK, D, dtype=dtype)
    mask = torch.arange(max(lens)).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)
    bias = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
    width = max(len(tb) for tb in tables[:-1])
    chunk_mask = torch.arange(prefill_ctx).unsqueeze(0) <= (
        torch.arange(prefill_new).unsqueeze(1) + prefill_ctx - prefill_new
    )
    meta = AttentionMetadata(
        slot_mapping=torch.cat(new_rows),
        num_decodes=len(lens),
        decode_blocks=torch.tensor([tb + [0] * (width - len(tb)) for tb in tables[:-1]]),
        block_size=BS,
        decode_len=max(lens),
        decode_mask=None if len(set(lens)) == 1 else bias[:, None, None, :],
        prefills=[PrefillSpan(len(lens), prefill_new, prefill_ctx, slots[-1], chunk_mask)],
    )
    out = paged_attention(q, k, v, k_cache, v_cache, meta, D**-0.5)

    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for i, s in enumerate(slots):
        rows = slice(i, i + 1) if i < len(lens) else slice(len(lens), t)
        ref = _reference(q[rows], k_cache[s], v_cache[s])
        torch.testing.assert_close(out[rows].double(), ref, atol=tol, rtol=tol)
