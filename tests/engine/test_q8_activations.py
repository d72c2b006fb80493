"""int8 activations on the CPU path (`--packed-weights int8`, cpu_kernels/q8_gemm.cpp).

What the kernels must compute is llama.cpp's Q4_1 x Q8_1 / Q8_0 x Q8_0 arithmetic: activations
rounded to int8 per 32-value block with scale max|x| / 127, multiplied by the exact weights. The
reference here is that definition written in torch (fake-quantized activations into a float64
matmul), with the weights from gguf-py's own quantizer, so neither side is the kernel's layout.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from torch import nn

from tests.engine.conftest import EngineFactory, collect, greedy, loaded_model
from trtllm_gateway.engine.builtin.cpu_kernels import build
from trtllm_gateway.engine.builtin.packed_linear import PackedLinear, pack_q4_1, pack_q8_0
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams

KINDS = {
    "q4_1": (GGMLQuantizationType.Q4_1, pack_q4_1),
    "q8_0": (GGMLQuantizationType.Q8_0, pack_q8_0),
}


def fake_quant(x: torch.Tensor) -> torch.Tensor:
    """x as the int8 kernels see it: per 32 values, d = max|x| / 127 and round(x / d) * d."""
    b = x.float().reshape(*x.shape[:-1], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return ((b * inv).round() * d).reshape(x.shape)


def gguf_linear(n: int, k: int, kind: str, seed: int) -> nn.Linear:
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    qtype = KINDS[kind][0]
    w = torch.from_numpy(quants.dequantize(quants.quantize(x, qtype), qtype).copy())
    lin = nn.Linear(k, n, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    return lin


def test_quantize_matches_definition(kernels: Any) -> None:
    x = torch.randn(7, 96) * torch.tensor([0.01, 1.0, 30.0]).repeat_interleave(32)
    x[2, 32:64] = 0  # an all-zero block: d = 0, q = 0
    qx, xs = kernels.quantize_q8(x)
    assert qx.dtype == torch.int8 and xs.shape == (7, 3, 2)
    d = xs[..., 0:1]
    assert torch.equal(d, x.view(7, 3, 32).abs().amax(-1, keepdim=True) / 127)
    assert torch.equal(qx.view(7, 3, 32).float() * d, fake_quant(x).view(7, 3, 32))
    assert qx.abs().max() == 127 and torch.equal(qx[2, 32:64], torch.zeros(32, dtype=torch.int8))
    torch.testing.assert_close(xs[..., 1], (qx.view(7, 3, 32).float() * d).sum(-1))


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 6, 7, 8, 33, 200])  # AVX2: 4-row tiles and each remainder
def test_int8_kernel_is_weights_times_quantized_activations(
    kernels: Any, kind: str, rows: int
) -> None:
    lin = gguf_linear(96, 576, kind, seed=rows)
    packed = PackedLinear(lin, kind, KINDS[kind][1](lin.weight), kernels, int8=True)  # type: ignore[arg-type]
    assert packed.int8
    x = torch.randn(rows, 576)
    ref = fake_quant(x).double() @ lin.weight.double().T
    out = packed(x)  # this build's int8 path: AVX512-VNNI, AVX-VNNI or AVX2 (kernels.q8_path())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # int8 is not float32: the gap to the dense product is the activations' rounding.
    assert (out - lin(x)).abs().max() > 1e-4
    qx, xs = kernels.quantize_q8(x)  # the portable loop: the same sums, one value at a time
    slow = kernels.q8_mm(qx, xs, packed.qs, packed.scales, kind == "q4_1", True)
    torch.testing.assert_close(slow, out, rtol=1e-5, atol=1e-5)


def test_int8_needs_whole_column_groups(kernels: Any) -> None:
    lin = gguf_linear(40, 64, "q4_1", seed=3)  # 40 columns: not groups of 16
    packed = PackedLinear(lin, "q4_1", pack_q4_1(lin.weight), kernels, int8=True)  # type: ignore[arg-type]
    assert not packed.int8  # stays on the float32 kernels
    x = torch.randn(3, 64)
    torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)


async def answer_logprobs(engine: Any, seq: list[int], start: int, rid: str) -> torch.Tensor:
    """The logprobs of seq[start:], each given the tokens before it (teacher-forced)."""
    sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    events = await collect(engine, GenerateRequest(rid, tuple(seq), sp))
    lps = next(e.prompt_logprobs for e in events if e.prompt_logprobs)
    return torch.tensor([lp.logprob for lp in lps[start - 1 :]])  # lps[j] is seq[j + 1]


async def test_engine_int8_stays_close_to_float32(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    """The real SmolLM2 GGUF with int8 activations: every projection and the LM head run the
    int8 kernels, and teacher-forced on float32's greedy answers the int8 engine's logprobs stay
    within quantization noise of float32's (measured: 0.007-0.05 nats mean, 0.24 at most over
    these prompts). Greedy tokens are not compared: with int8 activations a one-ulp change of an
    input can flip a rounding, so even a reference that quantizes the same way diverges from the
    kernels by as much as float32 does; docs/benchmarks.md counts the greedy differences."""
    # Every x86 build but the portable one has native int8 dot products (AVX2 included), and
    # CI's x86 machines select avx2 or avx512: this runs there; the loader's gate is tested below.
    assert build.block_gemm().q8_native()  # type: ignore[union-attr]
    int8 = await make_engine(packed_weights="int8")
    f32 = await make_engine(packed_weights="auto")
    model = loaded_model(int8)
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 4 * model.cfg.num_layers + 1 and all(m.int8 for m in packed)
    for i, prompt in enumerate(chat_prompts):
        answer = await collect(f32, GenerateRequest(f"g{i}", tuple(prompt), greedy(32)))
        seq = [*prompt, *(t for e in answer for t in e.token_ids)]
        want = await answer_logprobs(f32, seq, len(prompt), f"f{i}")
        got = await answer_logprobs(int8, seq, len(prompt), f"q{i}")
        assert len(got) == len(seq) - len(prompt)
        gap = (got - want).abs()
        assert gap.mean() < 0.1 and gap.max() < 0.6, (i, gap.mean(), gap.max())


async def test_int8_on_the_portable_build_keeps_float32_activations(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the portable build lacks native int8 dot products (its loop is the tests' reference,
    slower than float32's): there the loader keeps float32 activations and says why."""
    kernels = build.block_gemm()
    monkeypatch.setattr(kernels, "q8_native", lambda: False)
    monkeypatch.setattr(kernels, "simd_path", lambda: "portable")
    with caplog.at_level(logging.WARNING):
        engine = await make_engine(packed_weights="int8")
    assert "int8 activations need the avx2 or avx512 CPU kernels (this is the portable build)" in (
        caplog.text
    )
    packed = [m for m in loaded_model(engine).modules() if isinstance(m, PackedLinear)]
    assert packed and not any(m.int8 for m in packed)


def test_int8_activations_refuse_a_resolved_bf16_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """--dtype auto on --device auto resolves in the loader (bf16 on CUDA): checked there too."""
    from trtllm_gateway.config.engine import EngineConfig
    from trtllm_gateway.engine.builtin import loader

    config = EngineConfig(device="cpu", packed_weights="int8")
    monkeypatch.setattr(loader, "pick_dtype", lambda *a: torch.bfloat16)
    with pytest.raises(ValueError, match="--packed-weights int8 is for the CPU path"):
        loader.load(config)
