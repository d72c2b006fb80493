"""FP8 (e4m3) arithmetic of --quantization fp8 / --kv-cache-dtype fp8 (engine/builtin/fp8.py),
the reference the CUDA kernels are tested against on the GPU (tests/gpu/test_fp8.py)."""

from __future__ import annotations

import pytest
import torch

from tests.configs import resolve_args
from trtllm_gateway.engine.builtin import fp8
from trtllm_gateway.engine.builtin.fp8_linear import Fp8Linear, quantize_fp8


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_e4m3_constants_are_torchs() -> None:
    assert torch.finfo(fp8.FP8).max == fp8.E4M3_MAX
    # e4m3 keeps 3 mantissa bits: the grid near 1 is 1/8, so the rounding error is at most 1/16.
    assert torch.tensor([1.0625]).to(fp8.FP8).float().item() in (1.0, 1.125)


def test_weights_quantize_per_channel_to_the_full_range() -> None:
    w = torch.randn(64, 256) * torch.logspace(-3, 1, 64)[:, None]  # rows 4 decades apart
    q, scale = fp8.quantize_weight(w)
    assert q.dtype == fp8.FP8 and scale.shape == (64,) and scale.dtype == torch.float32
    assert torch.allclose(q.float().abs().amax(1), torch.full((64,), fp8.E4M3_MAX))
    back = fp8.dequantize(q, scale[:, None], torch.float32)
    # Relative to each row's own size: one scale per row keeps small rows as precise as big ones.
    per_row = (back - w).norm(dim=1) / w.norm(dim=1)
    assert per_row.max() < 0.04, per_row.max()
    # A zero row keeps a finite scale and quantizes to zeros.
    q0, s0 = fp8.quantize_weight(torch.zeros(2, 8))
    assert torch.isfinite(s0).all() and q0.float().abs().sum() == 0


def test_activations_quantize_per_token() -> None:
    x = torch.randn(5, 300) * torch.tensor([1e-3, 1.0, 50.0, 1e3, 0.1])[:, None]
    q, s = fp8.quantize_rows(x)
    assert s.shape == (5, 1)
    back = q.float() * s
    assert ((back - x).norm(dim=1) / x.norm(dim=1)).max() < 0.04


def test_fake_linear_error_against_the_float_product() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 384, bias=True)
    x = torch.randn(9, 512)
    layer = Fp8Linear.from_linear(lin)
    out = layer(x)  # on the CPU: the emulation
    assert out.dtype == x.dtype and out.shape == (9, 384)
    err = rel(out, lin(x).detach())
    # Both operands rounded to e4m3 (<= 1/16 relative each, ~2.5% rms): a few percent, not 0.
    assert 0.005 < err < 0.06, err
    # The same arithmetic spelled out: dequantized operands, float64 sums.
    xq, xs = fp8.quantize_rows(x)
    ref = (xq.double() * xs.double()) @ (
        layer.weight.double() * layer.weight_scale.double()[:, None]
    ).T
    torch.testing.assert_close(out.double(), ref + lin.bias.double(), rtol=1e-5, atol=1e-5)


def test_kv_round_trip_with_a_scale() -> None:
    k = torch.randn(32, 4, 64) * 3
    for scale in (1.0, 0.05):
        stored = fp8.quantize_kv(k, scale)
        assert stored.dtype == fp8.FP8
        assert rel(fp8.dequantize(stored, scale, torch.float32), k) < 0.04
    # Values past 448 x scale saturate instead of becoming NaN.
    big = fp8.quantize_kv(torch.tensor([1e6, -1e6]), 1.0).float()
    assert big.tolist() == [448.0, -448.0]


def test_quantize_fp8_swaps_every_linear_but_the_lm_head() -> None:
    from trtllm_gateway.engine.builtin.model import LlamaModel
    from trtllm_gateway.engine.builtin.model_config import ModelConfig

    cfg = ModelConfig.from_dict(
        {
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 100,
            "max_position_embeddings": 64,
            "tie_word_embeddings": False,
        }
    )
    model = LlamaModel(cfg, 64)
    assert quantize_fp8(model, {}) == 2 * 4
    kinds = {n: type(m).__name__ for n, m in model.named_modules() if "proj" in n or "head" in n}
    assert kinds["lm_head"] == "Linear"
    assert {v for k, v in kinds.items() if k != "lm_head"} == {"Fp8Linear"}
    # One byte a weight: no dense copy is kept.
    assert all(p.dtype != torch.float32 for n, p in model.named_buffers() if n.endswith("weight"))


def test_fp8_is_refused_on_the_cpu_with_a_reason() -> None:
    with pytest.raises(ValueError, match=r"compute capability 8\.9"):
        resolve_args("--device", "cpu", "--quantization", "fp8")
    with pytest.raises(ValueError, match=r"compute capability 8\.9"):
        resolve_args("--device", "cpu", "--kv-cache-dtype", "fp8")
    with pytest.raises(ValueError, match="bf16"):
        resolve_args("--device", "cuda", "--quantization", "fp8", "--dtype", "float32")
    # The device's own check, once --device auto resolved to a CPU (the loader raises it).
    why = fp8.unsupported(torch.device("cpu"))
    assert why is not None and "8.9" in why
    ok = resolve_args("--device", "cuda", "--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3")
    assert ok.engine.quantization == "fp8" and ok.engine.fp8_kv


def test_trtllm_gets_the_kv_dtype_and_refuses_load_time_fp8() -> None:
    from tests.configs import trtllm_args

    assert trtllm_args(engine="trtllm", kv_cache_dtype="fp8")["kv_cache_config"]["dtype"] == "fp8"
    assert "dtype" not in trtllm_args(engine="trtllm")["kv_cache_config"]
    with pytest.raises(ValueError, match="FP8 checkpoint"):
        resolve_args("--engine", "trtllm", "--quantization", "fp8")


def check_kv_handoff(device: torch.device) -> None:
    """An e4m3 cache moves as its bytes; a sibling with a bf16 cache refuses the blob."""
    from trtllm_gateway.engine.builtin.kv_transfer import decode_kv, export_kv, import_kv
    from trtllm_gateway.engine.disagg.kv_wire import KvWireError

    layers, slots_n, hk, d = 3, 64, 8, 128
    src = [
        (
            fp8.quantize_kv(torch.randn(slots_n, hk, d, device=device), 1.0),
            fp8.quantize_kv(torch.randn(slots_n, hk, d, device=device), 1.0),
        )
        for _ in range(layers)
    ]
    layout = "llama:3x8x128:torch.float8_e4m3fn:bs16"
    slots = torch.tensor([5, 6, 7, 40, 41], device=device)
    blob = export_kv(src, slots, layout, 16)
    n, kv = decode_kv(blob, layout)
    assert n == 5 and kv.dtype == fp8.FP8
    dst = [(torch.zeros_like(k), torch.zeros_like(v)) for k, v in src]
    to = torch.tensor([0, 1, 2, 3, 4], device=device)
    import_kv(dst, to, kv)
    for (sk, sv), (dk, dv) in zip(src, dst, strict=True):
        assert torch.equal(dk[to].view(torch.uint8), sk[slots].view(torch.uint8))
        assert torch.equal(dv[to].view(torch.uint8), sv[slots].view(torch.uint8))
    with pytest.raises(KvWireError):
        decode_kv(blob, layout.replace("float8_e4m3fn", "bfloat16"))


def test_kv_handoff_moves_fp8_bytes_and_refuses_other_layouts() -> None:
    check_kv_handoff(torch.device("cpu"))


def test_a_gpu_without_fp8_is_refused_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8.unsupported on CUDA devices, the GPU stubbed: an A100 (8.0) is refused by name, an
    H100 (9.0) and an L4 (8.9, Ada) pass; the loader raises the reason before loading."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _d=None: "NVIDIA A100-SXM4-80GB")
    for cap, ok in (((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _d=None, c=cap: c)
        why = fp8.unsupported(torch.device("cuda"))
        assert (why is None) == ok, (cap, why)
        if not ok:
            assert why is not None and "A100" in why and f"{cap[0]}.{cap[1]}" in why


def test_serve_refuses_fp8_before_starting_where_auto_is_a_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.configs import gateway
    from trtllm_gateway.engine.factory import preflight

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for flags in ({"quantization": "fp8"}, {"kv_cache_dtype": "fp8"}):
        with pytest.raises(ValueError, match=r"compute capability 8\.9 .* the device is cpu"):
            preflight(gateway(**flags))
    preflight(gateway())  # no FP8 asked: nothing to refuse
