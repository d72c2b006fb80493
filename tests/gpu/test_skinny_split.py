"""Split-K in the skinny GEMM (kernels/skinny_gemm.py, issue 39): K cut into slices, each a
program, the last slice of a column tile to take its ticket adds the partials in slice order.
Against the unsplit kernel and float64, the same bits call after call and replay after replay
(the order of the sum does not follow which slice finished last), the tickets back at zero."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_kernels import CUDA, rel_err
from trtllm_gateway.engine.builtin import fp8

# The kernels import triton, which CI's CPU venv lacks: imported inside the tests, as elsewhere.

SHAPES = [(4096, 4096), (6144, 4096), (4096, 14336), (1536, 576), (100, 520)]


@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("splits", [2, 3, 8])
@pytest.mark.parametrize("fp8_weights", [False, True])
def test_split_k_equals_the_unsplit_kernel_and_repeats_its_bits(
    rows: int, n: int, k: int, splits: int, fp8_weights: bool
) -> None:
    from trtllm_gateway.engine.builtin.kernels.fp8_quant import quantize_rows
    from trtllm_gateway.engine.builtin.kernels.skinny_gemm import _SPACES, skinny_linear

    torch.manual_seed(rows * n + k)
    w16 = (torch.randn(n, k, device=CUDA) * 0.02).to(torch.bfloat16)
    x16 = torch.randn(rows, k, device=CUDA).to(torch.bfloat16)
    if fp8_weights:
        w, scale = fp8.quantize_weight(w16)
        xq, xs = quantize_rows(x16)
        ref = fp8.fake_linear(x16.double(), w, scale, None).double()
        kw = {"scale": scale, "widen": 2, "out_dtype": torch.bfloat16, "x_scale": xs}
        x = xq
    else:
        w, x, kw = w16, x16, {}
        ref = x16.double() @ w16.double().T
    tiles = {"block_n": 32, "block_k": 256, "num_stages": 3, "num_warps": 4}
    unsplit = skinny_linear(x, w, **tiles, **kw)  # type: ignore[arg-type]
    first = skinny_linear(x, w, **tiles, splits=splits, **kw)  # type: ignore[arg-type]
    assert rel_err(first, ref) < 1e-2
    assert rel_err(first, unsplit.double()) < 1e-2
    for _ in range(20):  # the slices finish in another order each time: the same bits
        assert torch.equal(skinny_linear(x, w, **tiles, splits=splits, **kw), first)  # type: ignore[arg-type]
    # Into a residual, as o_proj and down_proj run.
    res = torch.randn(rows, n, device=CUDA).to(torch.bfloat16)
    want = res.double() + ref
    skinny_linear(x, w, res, **tiles, splits=splits, **kw)  # type: ignore[arg-type]
    assert rel_err(res, want) < 1e-2
    space = _SPACES[id(w)]
    torch.cuda.synchronize()
    assert int(space.tickets.abs().sum()) == 0  # every tile's last slice reset its ticket


def test_split_k_replays_from_a_cuda_graph() -> None:
    """Captured once and replayed many times: each replay's tickets start at zero (the last
    slice resets them), so every replay gives the eager call's bits."""
    from trtllm_gateway.engine.builtin.kernels.fp8_quant import quantize_rows
    from trtllm_gateway.engine.builtin.kernels.skinny_gemm import skinny_linear

    torch.manual_seed(1)
    w = (torch.randn(4096, 4096, device=CUDA) * 0.02).to(torch.bfloat16)
    q, scale = fp8.quantize_weight(w)
    x = torch.randn(1, 4096, device=CUDA).to(torch.bfloat16)
    xq, xs = quantize_rows(x)
    kw = {"scale": scale, "widen": 2, "out_dtype": torch.bfloat16, "x_scale": xs, "splits": 4}
    eager = skinny_linear(xq, q, **kw)  # type: ignore[arg-type]
    out = torch.empty_like(eager)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(3):  # three calls a replay share the tickets in stream order
            out.copy_(skinny_linear(xq, q, **kw))  # type: ignore[arg-type]
    for _ in range(50):
        out.zero_()
        g.replay()
        assert torch.equal(out, eager)
