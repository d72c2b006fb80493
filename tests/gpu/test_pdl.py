"""Programmatic dependent launch on the decode path (kernels/pdl.py, issue 39): every kernel of
the FP8 chain launched early still reads what the kernel before it wrote, however late that
kernel writes it.

The kernel before is a stand-in that signals its dependents at once and then spins for about a
millisecond before it writes the inputs: a kernel that read them before its wait would see the
poison left there (NaN). Eager and in a CUDA graph (where the early launch becomes a
programmatic edge); against the same calls with PDL off (GATEWAY_PDL=0), bit for bit. Without
the GEMM's wait, the graph cases of the first test failed on an H200. The last test runs two
layers of the chain as the engine's skinny path does (each kernel launched early after one
that signalled), in a graph, against PDL off.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu.test_kernels import CUDA
from trtllm_gateway.engine.builtin import fp8

# triton (and the kernels, which import it) only where the tests run: CI's CPU venv has none.


@functools.cache
def _late_writer() -> Any:
    import triton
    import triton.language as tl

    from trtllm_gateway.engine.builtin.kernels.pdl import gdc_launch_dependents

    @triton.jit
    def kernel(
        src_ptr, dst_ptr, res_src_ptr, res_ptr, sink_ptr, n, rn, spin, BLOCK: tl.constexpr
    ) -> None:
        """Signal dependents, spin, then copy src -> dst and res_src -> res (one program)."""
        gdc_launch_dependents()
        c = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], tl.float32) + 1.0
        for _ in range(spin):  # a dependent chain the compiler cannot drop: its result is stored
            acc = acc * 1.0000001 + 1e-7
        tl.store(sink_ptr + c, acc)
        for off in range(0, n, BLOCK):
            m = off + c < n
            tl.store(dst_ptr + off + c, tl.load(src_ptr + off + c, mask=m), mask=m)
        for off in range(0, rn, BLOCK):
            m = off + c < rn
            tl.store(res_ptr + off + c, tl.load(res_src_ptr + off + c, mask=m), mask=m)

    return kernel


def late(src: torch.Tensor, dst: torch.Tensor, res_src: torch.Tensor, res: torch.Tensor) -> None:
    """dst = src and res = res_src, written about a millisecond after the kernel signals."""
    sink = torch.empty(1024, device=CUDA)
    raw = (src.view(torch.uint8), dst.view(torch.uint8))
    n, rn = raw[0].numel(), res.numel()
    _late_writer()[(1,)](*raw, res_src, res, sink, n, rn, 200000, BLOCK=1024)


def poison(t: torch.Tensor) -> None:
    """All bits set: NaN in float32, bf16 and e4m3."""
    t.view(torch.uint8).fill_(0xFF)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).clone()


def replayed(step: Any, graph: bool) -> list[torch.Tensor]:
    """step()'s outputs (as bits), eager or from the third replay of its graph (all replays the
    same)."""
    if not graph:
        return [bits(o) for o in step()]
    step()  # warm: compile
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()
    runs = []
    for _ in range(3):
        g.replay()
        runs.append([bits(o) for o in outs])
    assert all(all(map(torch.equal, r, runs[0])) for r in runs)
    return runs[0]


def assert_early_is_plain(monkeypatch: pytest.MonkeyPatch, step: Any, graph: bool) -> None:
    from trtllm_gateway.engine.builtin.kernels import pdl

    assert pdl.enabled(CUDA)
    early = replayed(step, graph)
    monkeypatch.setenv(pdl.ENV, "0")
    plain = replayed(step, graph)
    for e, p in zip(early, plain, strict=True):
        assert torch.equal(e, p)
    monkeypatch.delenv(pdl.ENV)


CHAIN_KERNELS = [
    "rms_norm",
    "rms_norm_fp8",
    "silu_mul_fp8",
    "quantize_rows",
    "rope_and_store",
    "attention_e4m3",
    "attention_e4m3_split",
    "attention_bf16_split",
    "skinny_fp8_of_bf16",
]


def chain_step(name: str) -> Any:
    """A step: the late writer writes the kernel's input (poisoned first), then the kernel runs
    launched early (where PDL is on). Returns its outputs."""
    from trtllm_gateway.engine.builtin.kernels import fused_ops
    from trtllm_gateway.engine.builtin.kernels.decode_attention import decode_attention
    from trtllm_gateway.engine.builtin.kernels.fp8_quant import quantize_rows
    from trtllm_gateway.engine.builtin.kernels.rope_store import rope_and_store
    from trtllm_gateway.engine.builtin.kernels.skinny_gemm import skinny_fp8

    torch.manual_seed(11)
    nq, nkv, hd, page = 32, 8, 128, 16
    bf = torch.bfloat16
    spare = torch.zeros(1, device=CUDA).to(bf)  # the late writer's second copy: none

    def fed(src: torch.Tensor, kernel: Any) -> Any:
        dst = torch.empty_like(src)

        def step() -> list[torch.Tensor]:
            poison(dst)
            late(src, dst, spare, spare)
            return list(kernel(dst))

        return step

    if name.startswith("rms_norm"):
        x, w = torch.randn(2, 4096, device=CUDA).to(bf), torch.randn(4096, device=CUDA).to(bf)
        if name == "rms_norm":
            return fed(x, lambda d: [fused_ops.rms_norm(d, w, 1e-5, early=True)])
        return fed(x, lambda d: fused_ops.rms_norm_fp8(d, w, 1e-5))
    if name == "silu_mul_fp8":
        return fed(torch.randn(2, 2 * 14336, device=CUDA).to(bf), fused_ops.silu_mul_fp8)
    if name == "quantize_rows":
        return fed(torch.randn(2, 4096, device=CUDA).to(bf), quantize_rows)
    if name == "rope_and_store":
        from trtllm_gateway.engine.builtin.model_config import ModelConfig
        from trtllm_gateway.engine.builtin.rope import RotaryEmbedding

        cfg = ModelConfig.from_file(Path("trtllm_gateway/config/models/llama-3.1-8b.json"))
        rope = RotaryEmbedding(cfg, 4096).to(CUDA)
        pos = torch.tensor([1000, 7], device=CUDA)
        slots = torch.tensor([5, 40], device=CUDA)
        kc = torch.zeros(64, nkv, hd, device=CUDA).to(fp8.FP8)
        vc = torch.zeros_like(kc)

        def rope_store(d: torch.Tensor) -> list[torch.Tensor]:
            scales = (0.5, 0.25)
            q = rope_and_store(d, pos, rope.cos, rope.sin, kc, vc, slots, nq, nkv, hd, scales, True)
            return [q, kc, vc]

        return fed(torch.randn(2, (nq + 2 * nkv) * hd, device=CUDA).to(bf), rope_store)
    if name.startswith("attention"):
        cache = bf if "bf16" in name else fp8.FP8
        splits = 4 if name.endswith("split") else 1
        ctx = 300
        kc = torch.randn(32 * page, nkv, hd, device=CUDA).to(cache)
        vc = torch.randn(32 * page, nkv, hd, device=CUDA).to(cache)
        bt = torch.randperm(32, device=CUDA)[: -(-ctx // page)].to(torch.int32).view(1, -1)
        lens = torch.tensor([ctx], dtype=torch.int32, device=CUDA)

        def attend(d: torch.Tensor) -> list[torch.Tensor]:
            scale, kv = hd**-0.5, (0.5, 0.25)
            o = decode_attention(d, kc, vc, bt, lens, scale, page, splits, kv_scales=kv, early=True)
            return [o]

        return fed(torch.randn(1, nq, hd, device=CUDA).to(bf), attend)
    assert name == "skinny_fp8_of_bf16"  # o_proj: the row quantization, then the GEMM
    w, scale = fp8.quantize_weight((torch.randn(4096, 4096, device=CUDA) * 0.02).to(bf))
    x_src, res_src = (torch.randn(2, 4096, device=CUDA).to(bf) for _ in range(2))
    x, res = torch.empty_like(x_src), torch.empty_like(res_src)

    def gemm() -> list[torch.Tensor]:
        poison(x)
        poison(res)
        late(x_src, x, res_src, res)
        skinny_fp8(x, w, scale, res)
        return [res]

    return gemm


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("name", CHAIN_KERNELS)
def test_each_kernel_of_the_chain_waits_for_the_kernel_before_it(
    monkeypatch: pytest.MonkeyPatch, name: str, graph: bool
) -> None:
    step = chain_step(name)
    outs = step()
    torch.cuda.synchronize()
    for o in outs:
        assert not torch.isnan(o.float()).any(), name
    assert_early_is_plain(monkeypatch, step, graph)


def test_pdl_is_on_for_this_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtllm_gateway.engine.builtin.kernels import pdl

    assert pdl.enabled(CUDA)  # Hopper or later: the lent GPUs
    monkeypatch.setenv(pdl.ENV, "0")
    assert not pdl.enabled(CUDA)


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("graph", [False, True])
def test_an_early_gemm_waits_for_the_kernel_before_it(
    monkeypatch: pytest.MonkeyPatch, splits: int, graph: bool
) -> None:
    from trtllm_gateway.engine.builtin.kernels import pdl
    from trtllm_gateway.engine.builtin.kernels.fp8_quant import quantize_rows
    from trtllm_gateway.engine.builtin.kernels.skinny_gemm import skinny_linear

    torch.manual_seed(7)
    n, k, rows = 4096, 4096, 2
    w16 = (torch.randn(n, k, device=CUDA) * 0.02).to(torch.bfloat16)
    x_src = torch.randn(rows, k, device=CUDA).to(torch.bfloat16)
    res_src = torch.randn(rows, n, device=CUDA).to(torch.bfloat16)
    res = torch.empty_like(res_src)
    # e4m3 weights, x quantized per row before, as RMSNorm / SiLU-mul hand it over
    w, scale = fp8.quantize_weight(w16)
    x_src, x_scale = quantize_rows(x_src)
    kw = {"scale": scale, "widen": 2, "x_scale": x_scale, "out_dtype": torch.bfloat16}
    ref_x = x_src.double() * x_scale.double()
    ref_w = w.double() * scale.double()[:, None]
    x = torch.empty_like(x_src)

    def step() -> None:
        x.view(torch.uint8).fill_(0x7F)  # NaN in e4m3
        res.fill_(float("nan"))
        late(x_src, x, res_src, res)  # signals at once, writes ~tens of us later
        skinny_linear(x, w, res, splits=splits, **kw)  # type: ignore[arg-type]

    def run() -> torch.Tensor:
        if not graph:
            step()
            return res.clone()
        g = torch.cuda.CUDAGraph()
        step()  # warm: compile, the split workspace
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            step()
        outs = []
        for _ in range(5):
            g.replay()
            outs.append(res.clone())
        assert all(torch.equal(o, outs[0]) for o in outs)
        return outs[0]

    assert pdl.enabled(CUDA)
    early = run()
    monkeypatch.setenv(pdl.ENV, "0")
    plain = run()
    assert not torch.isnan(early).any()
    assert torch.equal(early, plain)
    ref = res_src.double() + ref_x @ ref_w.T
    err = float((early.double() - ref).norm() / ref.norm())
    assert err < 2e-2, err


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("weights", ["fp8", "bf16"])
def test_two_layers_of_the_chain_launched_early_equal_plain_launches(
    monkeypatch: pytest.MonkeyPatch, weights: str, graph: bool
) -> None:
    """The skinny kernels for two layers of the 8B shape at batch 1 (model.py _forward_fused at
    up to 16 rows; FP8 weights with an e4m3 cache, bf16 with a bf16 one and cuBLAS for qkv and
    gate_up), RoPE + KV store, attention and RMSNorm launched early too (their `early`), the
    residual written late at the start: the same bits as with PDL off, and no NaN."""
    import torch.nn.functional as F

    from trtllm_gateway.engine.builtin.kernels.decode_attention import decode_attention
    from trtllm_gateway.engine.builtin.kernels.fp8_quant import QuantRows
    from trtllm_gateway.engine.builtin.kernels.fused_ops import (
        rms_norm,
        rms_norm_fp8,
        silu_mul,
        silu_mul_fp8,
    )
    from trtllm_gateway.engine.builtin.kernels.rope_store import rope_and_store
    from trtllm_gateway.engine.builtin.kernels.skinny_gemm import skinny_fp8, skinny_linear
    from trtllm_gateway.engine.builtin.model_config import ModelConfig
    from trtllm_gateway.engine.builtin.rope import RotaryEmbedding

    torch.manual_seed(5)
    cfg = ModelConfig.from_file(Path("trtllm_gateway/config/models/llama-3.1-8b.json"))
    rope = RotaryEmbedding(cfg, 4096).to(CUDA)
    nq, nkv, hd, page, hidden, inter = 32, 8, 128, 16, 4096, 14336
    bf = torch.bfloat16

    f8 = weights == "fp8"
    cache = fp8.FP8 if f8 else bf

    def weight(n: int, k: int) -> tuple[torch.Tensor, ...]:
        w = (torch.randn(n, k, device=CUDA) * 0.02).to(bf)
        return fp8.quantize_weight(w) if f8 else (w,)

    layers = [
        (
            weight((nq + 2 * nkv) * hd, hidden),
            weight(hidden, nq * hd),
            weight(2 * inter, hidden),
            weight(hidden, inter),
            torch.randn(32 * page, nkv, hd, device=CUDA).to(cache),
            torch.randn(32 * page, nkv, hd, device=CUDA).to(cache),
        )
        for _ in range(2)
    ]
    ln = torch.randn(hidden, device=CUDA).to(bf) * 0.1 + 1
    ctx = 333
    bt = torch.randperm(32, device=CUDA)[: -(-ctx // page)].to(torch.int32).view(1, -1)
    lens = torch.tensor([ctx], dtype=torch.int32, device=CUDA)
    pos = torch.tensor([ctx - 1], device=CUDA)
    slot = (bt[0, (ctx - 1) // page].long() * page + (ctx - 1) % page).view(1)
    res_src = torch.randn(1, hidden, device=CUDA).to(bf)
    residual = torch.empty_like(res_src)
    spare = torch.zeros(1, device=CUDA).to(bf)

    def step() -> list[torch.Tensor]:
        poison(residual)
        late(res_src, residual, spare, spare)
        for qkv_w, o_w, gu_w, down_w, kc, vc in layers:
            if f8:
                qkv = skinny_fp8(QuantRows(*rms_norm_fp8(residual, ln, 1e-5)), *qkv_w)
            else:
                qkv = F.linear(rms_norm(residual, ln, 1e-5, early=True), qkv_w[0])
            sc = (0.5, 0.25) if f8 else (1.0, 1.0)
            q = rope_and_store(qkv, pos, rope.cos, rope.sin, kc, vc, slot, nq, nkv, hd, sc, True)
            o = decode_attention(q, kc, vc, bt, lens, hd**-0.5, page, 4, kv_scales=sc, early=True)
            if f8:
                skinny_fp8(o.view(1, nq * hd), *o_w, residual)
                x = QuantRows(*rms_norm_fp8(residual, ln, 1e-5))
                act = QuantRows(*silu_mul_fp8(skinny_fp8(x, *gu_w)))
                skinny_fp8(act, *down_w, residual)
            else:
                skinny_linear(o.view(1, nq * hd), o_w[0], residual)
                g = F.linear(rms_norm(residual, ln, 1e-5, early=True), gu_w[0])
                skinny_linear(silu_mul(g), down_w[0], residual)
        return [residual]

    out = step()[0]
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    assert_early_is_plain(monkeypatch, step, graph)
