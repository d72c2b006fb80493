"""Packed GGUF blocks on the CPU path: exact packing, the C++ kernels, and the engine's greedy
tokens unchanged against dense float32 (the issue 14 requirement for a faster batch-1 step).

The Q4_1 / Q8_0 weights here come from gguf-py's own quantizer and dequantizer (the code that
wrote and that reads the default model's file), so the blocks are the real format's, not ours.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from torch import nn

from tests.engine.conftest import EngineFactory, collect, greedy, loaded_model
from trtllm_gateway.engine.builtin.attention import (
    AttentionMetadata,
    _decode_attention,
    decode_kernel,
)
from trtllm_gateway.engine.builtin.cpu_kernels import build
from trtllm_gateway.engine.builtin.packed_linear import (
    PACKED_MAX_ROWS,
    PackedLinear,
    pack_q4_1,
    pack_q8_0,
)
from trtllm_gateway.engine.protocol import GenerateRequest


def gguf_weights(n: int, k: int, kind: GGMLQuantizationType, seed: int = 0) -> torch.Tensor:
    """A float32 matrix as a GGUF loader sees it: quantized and dequantized by gguf-py."""
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    return torch.from_numpy(quants.dequantize(quants.quantize(x, kind), kind).copy())


def test_pack_recovers_gguf_blocks_and_refuses_anything_else() -> None:
    w4 = gguf_weights(64, 128, GGMLQuantizationType.Q4_1)
    qs, dm = pack_q4_1(w4)  # type: ignore[misc]
    assert qs.shape == (64, 64) and qs.dtype == torch.uint8 and dm.shape == (64, 4, 2)
    lo, hi = (qs & 15).view(64, 4, 16), (qs >> 4).view(64, 4, 16)
    q = torch.cat([lo, hi], -1).float()
    assert torch.equal(q * dm[..., :1] + dm[..., 1:], w4.view(64, 4, 32))  # bit for bit
    w8 = gguf_weights(64, 128, GGMLQuantizationType.Q8_0)
    q8, d = pack_q8_0(w8)  # type: ignore[misc]
    assert torch.equal((q8.float().view(64, 4, 32) * d[..., None]).view(64, 128), w8)
    assert pack_q4_1(torch.randn(64, 128)) is None  # plain floats are not blocks
    assert pack_q8_0(torch.randn(64, 128)) is None
    nudged = w4.clone()
    nudged[3, 40] = torch.nextafter(nudged[3, 40], torch.tensor(1.0))  # one ulp off
    assert pack_q4_1(nudged) is None
    assert pack_q4_1(torch.randn(64, 100)) is None  # not whole blocks


@pytest.mark.parametrize("kind", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_packed_linear_matches_dense(kernels: object, kind: GGMLQuantizationType) -> None:
    dense = nn.Linear(576, 1536, bias=False)
    with torch.no_grad():
        dense.weight.copy_(gguf_weights(1536, 576, kind, seed=1))
    pack = pack_q4_1 if kind == GGMLQuantizationType.Q4_1 else pack_q8_0
    packed = PackedLinear(dense, kind.name.lower(), pack(dense.weight), kernels)  # type: ignore[arg-type]
    for rows in (1, 3, PACKED_MAX_ROWS):
        x = torch.randn(rows, 576)
        ref = dense(x)
        out = packed(x)
        assert not torch.equal(out, ref) or rows == 0  # really the kernel: other rounding
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    big = torch.randn(PACKED_MAX_ROWS + 1, 576)
    assert torch.equal(packed(big), dense(big))  # prefill-sized steps stay dense


@pytest.mark.parametrize("kind", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_float_block_kernels_same_bits_at_any_row_count(
    kernels: object, kind: GGMLQuantizationType
) -> None:
    # block_gemm.cpp: a row's output is the same sum in the same order whichever path computes
    # it (1-2 rows widen in registers; AVX2 above 2 rows reads staged tiles of 3 columns x 4 rows,
    # with row remainders 1-3 and column groups of 1-2 when N is not a multiple of 3: 577 and 578
    # columns, 1 .. 9 and 64 rows cover them), and the AVX-512 and AVX2 builds agree bit for bit.
    simd: str = kernels.simd_path()  # type: ignore[attr-defined]
    avx = build.block_gemm("avx2") if "avx2" in build.supported() and simd != "portable" else None
    mm = "q4_1_mm" if kind == GGMLQuantizationType.Q4_1 else "q8_0_mm"
    pack = pack_q4_1 if kind == GGMLQuantizationType.Q4_1 else pack_q8_0
    for n in (576, 577, 578):
        w = gguf_weights(n, 1536, kind, seed=n)
        blocks = pack(w)
        assert blocks is not None
        for rows in (*range(1, 10), PACKED_MAX_ROWS):
            x = torch.randn(rows, 1536)
            out = getattr(kernels, mm)(x, *blocks)
            one_by_one = torch.cat(
                [getattr(kernels, mm)(x[r : r + 1], *blocks) for r in range(rows)]
            )
            assert torch.equal(out, one_by_one), (n, rows)
            if avx is not None:
                assert torch.equal(out, getattr(avx, mm)(x, *blocks)), (n, rows)
            torch.testing.assert_close(out, x @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("hq", "hk", "d"),
    [(9, 3, 64), (8, 2, 128), (12, 2, 128), (4, 4, 32)],  # AVX-512 paths (GQA 3, 4, 6); portable
)
def test_decode_kernel_matches_sdpa(kernels: object, hq: int, hk: int, d: int) -> None:
    torch.manual_seed(0)
    bs, blocks = 16, 40
    k_cache = torch.randn(blocks * bs, hk, d)
    v_cache = torch.randn(blocks * bs, hk, d)
    lens = [1, 17, 130, 64, 16, 15]  # whole, partial and single-token tiles of 16
    tables = torch.stack([torch.randperm(blocks)[:9] for _ in lens])  # scattered blocks
    longest = max(lens)
    keep = torch.arange(longest) < torch.tensor(lens)[:, None]
    mask = torch.zeros(keep.shape).masked_fill_(~keep, float("-inf"))[:, None, None, :]
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0),
        num_decodes=len(lens),
        decode_blocks=tables,
        block_size=bs,
        decode_len=longest,
        decode_mask=mask,
        decode_ctx_lens=torch.tensor(lens, dtype=torch.int32),
    )
    q = torch.randn(len(lens), hq, d)
    ref = _decode_attention(q, k_cache, v_cache, meta, 0.125)
    out = decode_kernel(kernels)(q, k_cache, v_cache, meta, 0.125)  # type: ignore[arg-type]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_build_failure_leaves_dense(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No compiler (a slim image): a warning, None, and the loader keeps nn.Linear."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with caplog.at_level(logging.WARNING):
        assert build.block_gemm.__wrapped__() is None
    assert "no C++ compiler" in caplog.text


async def test_engine_packs_the_default_model_and_answers_like_dense(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    """The real SmolLM2 GGUF: every projection is Q4_1 and the tied LM head Q8_0, all packed;
    greedy tokens equal dense float32 on every test prompt."""
    packed = await make_engine(packed_weights="auto")
    dense = await make_engine(packed_weights="off")
    model = loaded_model(packed)
    kinds = [m.kind for m in model.modules() if isinstance(m, PackedLinear)]
    assert kinds.count("q4_1") == 4 * model.cfg.num_layers and kinds.count("q8_0") == 1
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert not any(isinstance(m, PackedLinear) for m in loaded_model(dense).modules())
    for i, prompt in enumerate(chat_prompts):
        want = await collect(dense, GenerateRequest(f"d{i}", tuple(prompt), greedy(32)))
        got = await collect(packed, GenerateRequest(f"p{i}", tuple(prompt), greedy(32)))
        assert [t for e in got for t in e.token_ids] == [t for e in want for t in e.token_ids]


def test_rms_norm_kernel_matches_portable(kernels: object) -> None:
    from trtllm_gateway.engine.builtin.model import RMSNorm

    norm = RMSNorm(576, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576))
    x = torch.randn(5, 576) * 3
    ref, ref_bf16 = norm(x), norm(x.bfloat16())
    calls: list[int] = []

    def counted(*a: object) -> torch.Tensor:
        calls.append(1)
        return kernels.rms_norm(*a)  # type: ignore[attr-defined,no-any-return]

    norm.kernel = counted  # type: ignore[assignment]
    out = norm(x)
    assert calls == [1]  # really the kernel
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(norm(x.bfloat16()), ref_bf16)  # other dtypes keep the portable path


def test_rope_store_is_rotate_and_write_kv_bit_for_bit(kernels: object) -> None:
    """The fused kernel against rope.py's rotate and attention.write_kv: the same floats."""
    from trtllm_gateway.engine.builtin.attention import write_kv
    from trtllm_gateway.engine.builtin.model_config import ModelConfig
    from trtllm_gateway.engine.builtin.rope import RotaryEmbedding, rotate

    for nq, nkv, d in ((9, 3, 64), (4, 2, 40)):  # SmolLM2's heads; a head_dim off the SIMD path
        cfg = ModelConfig(
            model_type="llama", vocab_size=8, hidden_size=nq * d, intermediate_size=8,
            num_layers=1, num_heads=nq, num_kv_heads=nkv, head_dim=d, rms_norm_eps=1e-5,
            rope_theta=100000.0,
        )  # fmt: skip
        rope = RotaryEmbedding(cfg, 512)
        t = 37
        qkv = torch.randn(t, (nq + 2 * nkv) * d) * 4
        cos, ssin = rope.tables(torch.randint(0, 512, (t,)))
        slots = torch.randperm(64)[:t]
        caches = [torch.zeros(64, nkv, d) for _ in range(4)]
        qk = rotate(qkv[:, : (nq + nkv) * d].view(t, nq + nkv, d), cos, ssin)
        write_kv(caches[0], caches[1], qk[:, nq:], qkv[:, (nq + nkv) * d :].view(t, nkv, d), slots)
        q, k = kernels.rope_store(qkv, cos, ssin, caches[2], caches[3], slots, nq, nkv)  # type: ignore[attr-defined]
        assert torch.equal(q, qk[:, :nq]) and torch.equal(k, qk[:, nq:])
        assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])


def test_silu_mul_matches_torch(kernels: object) -> None:
    gate_up = torch.randn(5, 2 * 1536) * 6
    gate_up[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -0.0])  # exp's clamps and zeros
    gate, up = gate_up.split(1536, -1)
    ref = torch.nn.functional.silu(gate) * up
    torch.testing.assert_close(kernels.silu_mul(gate_up), ref, rtol=1e-6, atol=1e-6)  # type: ignore[attr-defined]
    odd = torch.randn(3, 2 * 40)  # a width off the SIMD path
    g2, u2 = odd.split(40, -1)
    torch.testing.assert_close(kernels.silu_mul(odd), torch.nn.functional.silu(g2) * u2)  # type: ignore[attr-defined]
