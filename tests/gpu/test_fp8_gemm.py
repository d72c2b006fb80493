"""kernels/fp8_gemm.py: the e4m3 GEMM (17-256 rows, 897-8,192) against fp8.fake_linear's
arithmetic in float64, at every config of its table and at ragged edges; the in-place residual
add rounds as HF Llama does; a CUDA graph replays it bit for bit; fp8_matmul falls back to
torch._scaled_mm where the table has nothing."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_kernels import CUDA, rel_err
from trtllm_gateway.engine.builtin import fp8


def operands(rows: int, n: int, k: int, seed: int = 0):  # type: ignore[no-untyped-def]
    from trtllm_gateway.engine.builtin.kernels.fp8_quant import quantize_rows

    g = torch.Generator(device=CUDA).manual_seed(seed)
    w = torch.randn(n, k, device=CUDA, generator=g) * 0.02
    wq, ws = fp8.quantize_weight(w.to(torch.bfloat16))
    x = (torch.randn(rows, k, device=CUDA, generator=g) * 2).to(torch.bfloat16)
    xq, xs = quantize_rows(x)
    ref = (xq.double() @ wq.double().T) * xs.double() * ws.double()[None, :]
    return xq, xs, wq, ws.float().contiguous(), ref


def table_cases() -> list[tuple[int, int, int]]:
    from trtllm_gateway.engine.builtin.fp8_gemm_table import CONFIGS

    cases = []
    for (n, k), entries in CONFIGS.items():
        low = 17
        for most, config in entries:
            if config is not None:
                cases += [(low, n, k), (most, n, k)]
            low = most + 1
    return cases


def test_each_config_of_the_table_is_exact() -> None:
    """Each config at the fewest and the most rows it is picked for (the table is read here:
    collecting this module on a CPU imports no Triton)."""
    from trtllm_gateway.engine.builtin.fp8_gemm_table import config_for
    from trtllm_gateway.engine.builtin.kernels.fp8_gemm import fp8_gemm

    cases = table_cases()
    assert len(cases) >= 16
    for rows, n, k in cases:
        config = config_for(rows, n, k)
        assert config is not None
        xq, xs, wq, ws, ref = operands(rows, n, k)
        out = fp8_gemm(xq, xs, wq, ws, torch.bfloat16, config)
        assert out.shape == (rows, n) and out.dtype == torch.bfloat16
        # float32 sums in another order, then bf16's rounding: within a few bf16 ulps
        assert rel_err(out, ref) < 4e-3, (rows, n, k, config)
        cublas = torch._scaled_mm(
            xq, wq.t(), scale_a=xs, scale_b=ws.view(1, -1), out_dtype=torch.bfloat16
        )
        assert rel_err(out, cublas.double()) < 4e-3, (rows, n, k, config)


@pytest.mark.parametrize(
    ("rows", "n", "k", "config"),
    [
        (1, 1000, 4160, (64, 64, 256, 6, 4)),  # one row; N and K past the tiles' edges
        (77, 520, 4096, (64, 128, 256, 4, 4)),
        (130, 6144, 4096, (128, 128, 128, 5, 8)),
        (255, 28672, 4096, (128, 256, 128, 4, 8)),
    ],
)
def test_ragged_edges(rows: int, n: int, k: int, config: tuple[int, ...]) -> None:
    """Rows, columns and K not multiples of the tiles: the TMA reads zeros past the edges, the
    stores are masked; nothing outside [rows, n] is written."""
    from trtllm_gateway.engine.builtin.fp8_gemm_table import Config
    from trtllm_gateway.engine.builtin.kernels.fp8_gemm import fp8_gemm

    xq, xs, wq, ws, ref = operands(rows, n, k, seed=1)
    big = torch.full((rows + 3, n + 8), float("nan"), device=CUDA, dtype=torch.bfloat16)
    res = big[:rows, :n]
    res.zero_()
    fp8_gemm(xq, xs, wq, ws, torch.bfloat16, Config(*config), residual=res)
    assert rel_err(res, ref) < 4e-3
    assert big[rows:].isnan().all() and big[:, n:].isnan().all()


@pytest.mark.parametrize("rows", [64, 256, 2000])  # 2000: a prefill chunk's config, ragged
def test_residual_add_rounds_the_product_first(rows: int) -> None:
    """residual += product: the product rounded to bf16, then the sum rounded (HF Llama's
    o_proj / down_proj add), the same bits as the product written out and added by torch."""
    from trtllm_gateway.engine.builtin.fp8_gemm_table import config_for
    from trtllm_gateway.engine.builtin.kernels.fp8_gemm import fp8_matmul

    n, k = 4096, 14336
    assert config_for(rows, n, k) is not None
    xq, xs, wq, ws, _ = operands(rows, n, k, seed=2)
    res = (torch.randn(rows, n, device=CUDA) * 4).to(torch.bfloat16)
    want = res + fp8_matmul(xq, xs, wq, ws, torch.bfloat16)
    got = fp8_matmul(xq, xs, wq, ws, torch.bfloat16, residual=res)
    assert got.data_ptr() == res.data_ptr()
    assert torch.equal(res, want)


def test_a_graph_replays_the_eager_bits() -> None:
    from trtllm_gateway.engine.builtin.kernels.fp8_gemm import fp8_matmul

    xq, xs, wq, ws, _ = operands(200, 4096, 4096, seed=3)
    eager = fp8_matmul(xq, xs, wq, ws, torch.bfloat16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_matmul(xq, xs, wq, ws, torch.bfloat16)
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, eager)


@pytest.mark.parametrize(("rows", "bias"), [(300, False), (128, False), (64, True)])
def test_fp8_matmul_falls_back_to_cublas(rows: int, bias: bool) -> None:
    """Past the table's rows, where cuBLASLt won (gate_up at 128 rows), or with a bias:
    torch._scaled_mm, the same arithmetic."""
    from trtllm_gateway.engine.builtin.fp8_gemm_table import config_for
    from trtllm_gateway.engine.builtin.kernels.fp8_gemm import fp8_matmul

    n, k = 28672, 4096
    assert (config_for(rows, n, k) is None) != bias
    xq, xs, wq, ws, ref = operands(rows, n, k, seed=4)
    b = torch.randn(n, device=CUDA).to(torch.bfloat16) if bias else None
    out = fp8_matmul(xq, xs, wq, ws, torch.bfloat16, bias=b)
    if b is not None:
        ref = ref + b.double()
    assert rel_err(out, ref) < 4e-3
