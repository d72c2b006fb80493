"""Programmatic dependent launch on the decode path (kernels/pdl.py, issue 39): the skinny GEMM
launched early still reads what the kernel before it wrote, however late that kernel writes it.

The kernel before is a stand-in that signals its dependents at once and then spins for about a
millisecond before it writes the activations and the residual: a GEMM that read them before its
wait would see the poison left there (NaN). Eager and in a CUDA graph (where the early launch
becomes a programmatic edge), split-K on and off, e4m3 weights (the bf16 skinny GEMM does not
launch early: bench/decode_chain.py measured it slower); against the same calls with PDL off
(GATEWAY_PDL=0), bit for bit. Without the GEMM's wait, the graph cases failed on an H200.
"""

from __future__ import annotations

import functools
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
