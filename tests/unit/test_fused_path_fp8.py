"""LlamaModel's fused path with FP8 layers on the CPU (model.py _forward_fused, fused_layer_tail):
the activations reach each Fp8Linear quantized per row by the operation before it (KernelOps'
norm_for / silu_mul_for), o_proj and down_proj add into the residual stream, and the final norm
feeds the LM head unquantized. FakeFp8Ops does that in plain torch with engine/builtin/fp8.py's
arithmetic (what the CUDA kernels are held to in tests/gpu/test_fp8.py); TorchOps hands the layers
plain rows and each Fp8Linear quantizes its own input (fp8.fake_linear). The two give the same
hidden states and KV: the wiring, not the kernels, is what is compared."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from tests.unit.test_piecewise_pieces import CFG, PAGE, TorchOps, _caches
from trtllm_gateway.engine.builtin import fp8
from trtllm_gateway.engine.builtin.attention import AttentionMetadata, KernelPrefill
from trtllm_gateway.engine.builtin.fp8_linear import Fp8Linear, quantize_fp8
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.model_config import ModelConfig


class Rows(NamedTuple):
    """kernels/fp8_quant.QuantRows without Triton: e4m3 [M, K] and float32 scales [M, 1]."""

    q: torch.Tensor
    scales: torch.Tensor


class FakeFp8Ops(TorchOps):
    """KernelOps' FP8 dataflow in plain torch; counts what reached each kind of layer."""

    def __init__(self, page: int) -> None:
        super().__init__(page)
        self.quantized_in = 0  # projections that were handed quantized rows
        self.unquantized_final = 0

    @staticmethod
    def _fp8(layer: nn.Module | None) -> bool:
        return isinstance(layer, Fp8Linear)

    def norm_for(  # type: ignore[override]
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        then: nn.Module | None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor | Rows:
        y = self.rms_norm(x, weight, eps, residual)
        if then is None:
            self.unquantized_final += 1
        return Rows(*fp8.quantize_rows(y)) if self._fp8(then) else y

    def silu_mul_for(self, gate_up: torch.Tensor, then: nn.Module) -> torch.Tensor | Rows:  # type: ignore[override]
        act = self.silu_mul(gate_up)
        return Rows(*fp8.quantize_rows(act)) if self._fp8(then) else act

    def project(self, x: torch.Tensor | Rows, layer: nn.Module) -> torch.Tensor:  # type: ignore[override]
        assert self._fp8(layer) and isinstance(x, Rows), "an Fp8Linear takes quantized rows"
        self.quantized_in += 1
        w = layer.weight.float() * layer.weight_scale[:, None]
        out = (x.q.float() * x.scales) @ w.T
        return out if layer.bias is None else out + layer.bias

    def add_norm_for(  # type: ignore[override]
        self,
        x: torch.Tensor | Rows,
        layer: nn.Module,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        then: nn.Module | None,
    ) -> torch.Tensor | Rows:
        rows = x if isinstance(x, Rows) else Rows(*fp8.quantize_rows(x))  # o_proj's input
        residual += self.project(rows, layer)
        return self.norm_for(residual, weight, eps, then)


def _step(model: LlamaModel, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """One 12-token prefill after 4 cached tokens."""
    table = torch.tensor([[2, 5, 7, 9]], dtype=torch.int32)
    pos = torch.arange(4, 16)
    slots = table.long()[0, pos // PAGE] * PAGE + pos % PAGE
    meta = AttentionMetadata(
        slot_mapping=slots,
        num_decodes=0,
        decode_block_tables=None,
        decode_ctx_lens=None,
        prefill=KernelPrefill(
            block_tables=table,
            ctx_lens=torch.tensor([16], dtype=torch.int32),
            q_starts=torch.tensor([0], dtype=torch.int32),
            q_lens=torch.tensor([12], dtype=torch.int32),
            tiles=torch.zeros(0, dtype=torch.int32),
        ),
    )
    ids = torch.randint(0, model.cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(1))
    out: torch.Tensor = model(ids, pos, kv, meta)
    return out


@torch.inference_mode()
def test_quantized_rows_flow_through_the_fused_path_as_the_layers_would_make_them() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict(CFG)
    model = LlamaModel(cfg, 256).eval()
    assert quantize_fp8(model, {}) == 4 * cfg.num_layers  # qkv, o, gate_up, down; not the LM head
    model.ops = TorchOps(PAGE)  # type: ignore[assignment]
    want_kv = _caches(cfg, 12 * PAGE)
    want = _step(model, want_kv)
    fake = FakeFp8Ops(PAGE)
    model.ops = fake  # type: ignore[assignment]
    got_kv = _caches(cfg, 12 * PAGE)
    got = _step(model, got_kv)

    assert fake.quantized_in == 4 * cfg.num_layers and fake.unquantized_final == 1
    # float32 both ways; the norms' sums in other orders may move a rare e4m3 rounding
    err = float((got - want).norm() / want.norm())
    assert err < 1e-3, err
    for (kg, vg), (kw, vw) in zip(got_kv, want_kv, strict=True):
        assert float((kg - kw).norm() / kw.norm()) < 1e-3
        assert float((vg - vw).norm() / vw.norm()) < 1e-3
