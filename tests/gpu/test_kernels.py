"""Triton kernels against plain PyTorch references computed in float64 on fresh random inputs.

Outputs are poisoned with NaN before each call, so an element the kernel fails to write fails.
Relative error ||out - ref|| / ||ref||: float32 < 1e-5, bfloat16 < 1e-2.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

CUDA = torch.device("cuda")
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(out).any(), "NaN in the kernel output"
    out, ref = out.detach().double(), ref.detach().double()  # references may carry grad
    return float((out - ref).norm() / ref.norm())


def paged_cache(
    num_blocks: int, page: int, hk: int, d: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(num_blocks * page, hk, d, device=CUDA).to(dtype)
    v = torch.randn(num_blocks * page, hk, d, device=CUDA).to(dtype)
    return k, v


def tables(lens: list[int], page: int, num_blocks: int) -> torch.Tensor:
    """Random, disjoint physical blocks per sequence, padded to a common width."""
    need = [-(-n // page) for n in lens]
    perm = torch.randperm(num_blocks)[: sum(need)].tolist()
    width = max(need)
    out = torch.zeros(len(lens), width, dtype=torch.int32)
    at = 0
    for i, n in enumerate(need):
        out[i, :n] = torch.tensor(perm[at : at + n])
        at += n
    return out.to(CUDA)


def ref_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    table: torch.Tensor,
    ctx: int,
    page: int,
    positions: list[int],
) -> torch.Tensor:
    """q: [n, Hq, D] for query positions `positions` of one sequence with ctx keys."""
    slots = (table.long().unsqueeze(1) * page + torch.arange(page, device=CUDA)).flatten()[:ctx]
    group = q.shape[1] // k.shape[1]
    kk = k[slots].double().repeat_interleave(group, 1)  # [ctx, Hq, D]
    vv = v[slots].double().repeat_interleave(group, 1)
    s = torch.einsum("nhd,thd->nht", q.double(), kk) / math.sqrt(q.shape[-1])
    pos = torch.tensor(positions, device=CUDA)
    mask = torch.arange(ctx, device=CUDA)[None, :] > pos[:, None]
    s = s.masked_fill(mask[:, None, :], float("-inf"))
    return torch.einsum("nht,thd->nhd", s.softmax(-1), vv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("hq", "hk", "d", "page"), [(32, 8, 128, 16), (9, 3, 64, 16), (8, 8, 64, 32)]
)
@pytest.mark.parametrize("splits", [1, 4])
def test_decode_attention(
    dtype: torch.dtype, hq: int, hk: int, d: int, page: int, splits: int
) -> None:
    from trtllm_gateway.engine.builtin.kernels.decode_attention import decode_attention

    lens = [1, 17, 300, 1000, 64]
    num_blocks = 200
    k, v = paged_cache(num_blocks, page, hk, d, dtype)
    bt = tables(lens, page, num_blocks)
    q = torch.randn(len(lens), hq, d, device=CUDA).to(dtype)
    out = torch.full_like(q, float("nan"))
    ctx = torch.tensor(lens, dtype=torch.int32, device=CUDA)
    decode_attention(q, k, v, bt, ctx, d**-0.5, page, splits, out=out)
    for i, n in enumerate(lens):
        ref = ref_attention(q[i : i + 1], k, v, bt[i], n, page, [n - 1])[0]
        assert rel_err(out[i], ref) < TOL[dtype], (i, n)


def test_decode_variants_are_compiled_up_front() -> None:
    """After warm_up, every split count the engine can pick (1..64) and any block-table width
    launch without compiling: a constexpr split count compiled a new kernel mid-serving."""
    from trtllm_gateway.engine.builtin.kernels import decode_attention as da

    kernels = (
        da._decode_split_kernel,
        da._decode_reduce_kernel,
        da.e4m3._decode_e4m3_kernel,
        da.all_heads._decode_heads_kernel,
    )

    def compiled() -> int:  # Triton's per-device caches: (kernels, keys, target, backend, binder)
        return sum(len(c[0]) for fn in kernels for c in fn.device_caches.values())

    for dtype, cache in (
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float8_e4m3fn),  # the e4m3 cache's own kernel
    ):
        k, v = (t.to(cache) for t in paged_cache(64, 16, 3, 64, torch.float32))
        da.warm_up(k, v, 9, dtype, 16)
        before = compiled()
        for splits in range(1, 65):
            for width, batch in ((1, 1), (5, 3), (16, 2), (33, 7)):
                bt = torch.randint(0, 64, (batch, width), dtype=torch.int32, device=CUDA)
                lens = torch.full((batch,), width * 16, dtype=torch.int32, device=CUDA)
                q = torch.randn(batch, 9, 64, device=CUDA).to(dtype)
                out = da.decode_attention(q, k, v, bt, lens, 0.125, 16, splits)
                assert torch.isfinite(out).all()
        assert compiled() == before, "a decode launch compiled a new kernel variant"
    # The count does see compiles: a tile size warm_up did not use is a new variant.
    da.decode_attention(q, k, v, bt, lens, 0.125, 16, 1, config=(16, 4, 2))
    assert compiled() == before + 1


@pytest.mark.parametrize("cache", [torch.bfloat16, torch.float8_e4m3fn])
def test_decode_padded_rows_are_zero(cache: torch.dtype) -> None:
    from trtllm_gateway.engine.builtin.kernels.decode_attention import decode_attention

    k, v = (t.to(cache) for t in paged_cache(8, 16, 2, 64, torch.float32))
    q = torch.randn(3, 4, 64, device=CUDA).to(torch.bfloat16)
    bt = torch.zeros(3, 2, dtype=torch.int32, device=CUDA)
    ctx = torch.tensor([0, 5, 0], dtype=torch.int32, device=CUDA)
    for splits in (1, 3):
        out = decode_attention(q, k, v, bt, ctx, 0.125, 16, splits)
        assert torch.isfinite(out).all()
        assert out[0].abs().max() == 0 and out[2].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hq", "hk", "d"), [(32, 8, 128), (9, 3, 64)])
def test_prefill_attention_chunks_and_prefix(dtype: torch.dtype, hq: int, hk: int, d: int) -> None:
    from trtllm_gateway.engine.builtin.kernels.prefill_attention import (
        prefill_attention,
        prefill_tiles,
    )

    page, num_blocks = 16, 300
    # (context after this step, query tokens this step): whole prompts, a chunk after cached
    # tokens (prefix hit or earlier chunk), a one-tile and a many-tile sequence.
    seqs = [(40, 40), (300, 77), (129, 129), (1000, 200), (65, 1)]
    k, v = paged_cache(num_blocks, page, hk, d, dtype)
    bt = tables([c for c, _ in seqs], page, num_blocks)
    total = sum(n for _, n in seqs)
    q = torch.randn(total, hq, d, device=CUDA).to(dtype)
    out = torch.full_like(q, float("nan"))
    starts = [sum(n for _, n in seqs[:i]) for i in range(len(seqs))]
    i32 = {"dtype": torch.int32, "device": CUDA}
    tiles = prefill_tiles(list(range(len(seqs))), [n for _, n in seqs])
    prefill_attention(
        q,
        k,
        v,
        out,
        bt,
        torch.tensor([c for c, _ in seqs], **i32),
        torch.tensor(starts, **i32),
        torch.tensor([n for _, n in seqs], **i32),
        torch.tensor(tiles, **i32),
        d**-0.5,
        page,
    )
    for i, (c, n) in enumerate(seqs):
        rows = slice(starts[i], starts[i] + n)
        ref = ref_attention(q[rows], k, v, bt[i], c, page, list(range(c - n, c)))
        assert rel_err(out[rows], ref) < TOL[dtype], (i, c, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_and_store(dtype: torch.dtype) -> None:
    from trtllm_gateway.engine.builtin.kernels.rope_store import rope_and_store
    from trtllm_gateway.engine.builtin.model_config import ModelConfig
    from trtllm_gateway.engine.builtin.rope import RotaryEmbedding

    cfg = ModelConfig.from_file(Path("trtllm_gateway/config/models/llama-3.1-8b.json"))
    rope = RotaryEmbedding(cfg, 4096).to(CUDA)
    nq, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    t = 37
    qkv = torch.randn(t, (nq + 2 * nkv) * hd, device=CUDA).to(dtype)
    pos = torch.randint(0, 4096, (t,), device=CUDA)
    slots = torch.randperm(200, device=CUDA)[:t]
    slots[3] = -1  # a padded row writes nothing
    kc = torch.full((200, nkv, hd), float("nan"), device=CUDA).to(dtype)
    vc = torch.full_like(kc, float("nan"))
    k_in = qkv[:, nq * hd : (nq + nkv) * hd].reshape(t, nkv, hd)
    q_ref, k_ref = rope(pos, qkv[:, : nq * hd].reshape(t, nq, hd), k_in)
    v_ref = qkv[:, (nq + nkv) * hd :].view(t, nkv, hd).clone()
    q = rope_and_store(qkv, pos, rope.cos, rope.sin, kc, vc, slots, nq, nkv, hd)
    keep = slots >= 0
    assert rel_err(q, q_ref) < TOL[dtype]
    assert rel_err(kc[slots[keep]], k_ref[keep]) < TOL[dtype]
    assert rel_err(vc[slots[keep]], v_ref[keep]) < TOL[dtype]
    written = torch.zeros(200, dtype=torch.bool, device=CUDA)
    written[slots[keep]] = True
    assert torch.isnan(kc[~written].float()).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_silu(dtype: torch.dtype) -> None:
    from trtllm_gateway.engine.builtin.kernels.fused_ops import rms_norm, silu_mul
    from trtllm_gateway.engine.builtin.model import RMSNorm

    n = 4096
    x = torch.randn(13, n, device=CUDA).to(dtype)
    res = torch.randn(13, n, device=CUDA).to(dtype)
    norm = RMSNorm(n, 1e-5).to(CUDA, dtype)
    norm.weight.data = torch.randn(n, device=CUDA).to(dtype)
    expect_res = x + res
    got = rms_norm(x, norm.weight, 1e-5, res)
    assert torch.equal(res, expect_res)
    assert rel_err(got, norm(expect_res)) < TOL[dtype]
    assert rel_err(rms_norm(x, norm.weight, 1e-5), norm(x)) < TOL[dtype]
    gu = torch.randn(7, 2 * 14336, device=CUDA).to(dtype)
    ref = torch.nn.functional.silu(gu[:, :14336]) * gu[:, 14336:]
    assert rel_err(silu_mul(gu), ref) < TOL[dtype]


def test_sampling_compiles_once_at_engine_start() -> None:
    """After compile_for, steps of any row count launch without compiling, with their temperatures
    and keys at any alignment (slices of one packed buffer, as the sampler passes them): an odd
    row count compiled a second variant mid-serving."""
    from trtllm_gateway.engine.builtin.kernels import sampling

    kernels = (sampling._sample_partial_kernel, sampling._sample_reduce_kernel)

    def compiled() -> int:  # Triton's per-device caches: (kernels, keys, target, backend, binder)
        return sum(len(c[0]) for fn in kernels for c in fn.device_caches.values())

    vocab = 49152
    # float32 (eager steps) and bf16 (a decode graph's logits), as TritonBackend compiles them
    sampling.compile_for(vocab, torch.device(CUDA), (torch.float32, torch.bfloat16))
    before = compiled()
    for rows, dtype in itertools.product(
        (1, 2, 3, 7, 8, 255, 256), (torch.float32, torch.bfloat16)
    ):
        for shift in (0, 8):  # byte offsets of the packed buffer in a ring (8-byte aligned)
            logits = torch.randn(rows, vocab, device=CUDA).to(dtype)
            packed = torch.zeros(shift + 12 * rows, dtype=torch.uint8, device=CUDA)[shift:]
            temps = packed[8 * rows :].view(torch.float32)
            keys = packed[: 8 * rows].view(torch.int64)
            temps[::2] = 0.7  # a few sampled rows among greedy ones
            out = sampling.sample(logits, temps, keys)
            greedy = temps == 0
            assert torch.equal(out[greedy], logits.argmax(-1)[greedy])
    assert compiled() == before, "a sampling launch compiled a new kernel variant"


def test_sampling_16_bit_logits_draws_what_their_float_copy_draws() -> None:
    """A decode graph's logits stay in the model's dtype (cuda_graph.py): the kernel reads them
    as float32, so greedy and seeded rows draw exactly the tokens their float copy gives."""
    from trtllm_gateway.engine.builtin.kernels.sampling import row_key, sample

    logits = (4 * torch.randn(64, 49152, device=CUDA)).to(torch.bfloat16)
    temps = torch.tensor([0.0, 0.7, 1.0, 1.3] * 16, device=CUDA)
    keys = torch.tensor([row_key(i, 3) for i in range(64)], device=CUDA)
    got = sample(logits, temps, keys)
    assert torch.equal(got, sample(logits.float(), temps, keys))
    assert torch.equal(got[temps == 0], logits.float().argmax(-1)[temps == 0])


def test_sampling_greedy_seeded_and_distribution() -> None:
    from trtllm_gateway.engine.builtin.kernels.sampling import row_key, sample

    logits = torch.randn(6, 128256, device=CUDA)
    logits[2, 5] = float("nan")  # NaN never wins
    zeros = torch.zeros(6, device=CUDA)
    keys = torch.tensor([row_key(i, 0) for i in range(6)], device=CUDA)
    assert torch.equal(sample(logits, zeros, keys), torch.nan_to_num(logits, -1e9).argmax(-1))
    ones = torch.ones(6, device=CUDA)
    a = sample(logits, ones, keys)
    b = sample(logits[[3, 0, 1, 2, 4, 5]], ones, keys[[3, 0, 1, 2, 4, 5]])
    assert torch.equal(a[[3, 0, 1, 2, 4, 5]], b)  # a row's draw depends on its key only
    probs = torch.tensor([0.5, 0.3, 0.2], device=CUDA)
    n = 20000
    rows = probs.log().repeat(n, 1)
    keys = torch.tensor([row_key(7, s) for s in range(n)], device=CUDA)
    freq = torch.bincount(sample(rows, torch.ones(n, device=CUDA), keys), minlength=3) / n
    assert torch.allclose(freq, probs, atol=0.015), freq


@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (300, 576), (4096, 14336)])
def test_skinny_linear(rows: int, n: int, k: int) -> None:
    from trtllm_gateway.engine.builtin.kernels.skinny_gemm import skinny_linear

    dtype = torch.bfloat16  # the model uses it for bf16/fp16 only (fp32 keeps cuBLAS)
    w = (torch.randn(n, k, device=CUDA) * 0.02).to(dtype)
    x = torch.randn(rows, k, device=CUDA).to(dtype)
    assert rel_err(skinny_linear(x, w), x.double() @ w.double().T) < TOL[dtype]
    res = torch.randn(rows, n, device=CUDA).to(dtype)
    expect = res.double() + (x.double() @ w.double().T)
    skinny_linear(x, w, residual=res)
    assert rel_err(res, expect) < TOL[dtype]
