"""FP8 checkpoints read as they are (engine/builtin/fp8_checkpoint.py), in the two layouts vLLM
and TensorRT-LLM load: NVIDIA ModelOpt (nvidia/Llama-3.1-8B-Instruct-FP8: scalar weight_scale
and input_scale, KV scales under k_proj.k_scale / v_proj.v_scale) and compressed-tensors
(RedHatAI/...-FP8-dynamic: weight_scale [N, 1] per channel, KV scales under self_attn.k_scale).
Before this reader an FP8 checkpoint loaded as e4m3 values cast to bf16 without their scales."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trtllm_gateway.engine.builtin import fp8
from trtllm_gateway.engine.builtin.fp8_checkpoint import Fp8Checkpoint, Fp8CheckpointError
from trtllm_gateway.engine.builtin.fp8_linear import Fp8Linear, quantize_fp8
from trtllm_gateway.engine.builtin.model_config import ModelConfig
from trtllm_gateway.engine.builtin.weights import build_model

CFG = ModelConfig.from_dict(
    {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    }
)
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def shapes() -> dict[str, tuple[int, int]]:
    h, i, kv = CFG.hidden_size, CFG.intermediate_size, CFG.num_kv_heads * CFG.head_dim
    return {
        "q_proj": (h, h),
        "k_proj": (kv, h),
        "v_proj": (kv, h),
        "o_proj": (h, h),
        "gate_proj": (i, h),
        "up_proj": (i, h),
        "down_proj": (h, i),
    }


def write_checkpoint(path: Path, layout: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A tiny FP8 Llama; returns each projection's (e4m3, per-row scales) as written."""
    gen = torch.Generator().manual_seed(0)
    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(CFG.vocab_size, CFG.hidden_size, generator=gen),
        "model.norm.weight": torch.ones(CFG.hidden_size),
        "lm_head.weight": torch.randn(CFG.vocab_size, CFG.hidden_size, generator=gen),
    }
    written: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in range(CFG.num_layers):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = torch.ones(CFG.hidden_size)
        t[p + "post_attention_layernorm.weight"] = torch.ones(CFG.hidden_size)
        for proj, shape in shapes().items():
            part = "self_attn" if proj[0] in "qkvo" else "mlp"
            name = f"{p}{part}.{proj}.weight"
            w = torch.randn(shape, generator=gen) * 0.05
            if layout == "modelopt":  # one scale for the tensor
                s = w.abs().amax() / fp8.E4M3_MAX
                q = (w / s).to(fp8.FP8)
                t[name + "_scale"] = s.reshape(())
                rows = s.expand(shape[0]).clone()
            else:  # compressed-tensors: one per output channel, [N, 1]
                q, rows = fp8.quantize_weight(w)
                t[name + "_scale"] = rows[:, None].clone()
            t[name] = q
            t[f"{p}{part}.{proj}.input_scale"] = torch.tensor(0.02)
            written[name] = (q, rows)
        if layout == "modelopt":
            t[p + "self_attn.k_proj.k_scale"] = torch.tensor(0.5 + layer)
            t[p + "self_attn.v_proj.v_scale"] = torch.tensor(0.25 + layer)
        else:
            t[p + "self_attn.k_scale"] = torch.tensor(0.5 + layer)
            t[p + "self_attn.v_scale"] = torch.tensor(0.25 + layer)
    path.mkdir(parents=True, exist_ok=True)
    save_file(t, str(path / "model.safetensors"))
    return written


@pytest.mark.parametrize("layout", ["modelopt", "compressed-tensors"])
def test_an_fp8_checkpoint_is_read_with_its_scales(tmp_path: Path, layout: str) -> None:
    written = write_checkpoint(tmp_path, layout)
    reader = Fp8Checkpoint()
    model = build_model(CFG, tmp_path, torch.float32, torch.device("cpu"), 64, reader=reader)
    assert reader.is_fp8
    # The dense model holds the dequantized weights (e4m3 x scale), not the raw e4m3 values.
    att = model.decoder_layers[1].self_attn
    q_rows = CFG.num_heads * CFG.head_dim
    q, s = written["model.layers.1.self_attn.q_proj.weight"]
    torch.testing.assert_close(att.qkv_proj.weight[:q_rows], q.float() * s[:, None])
    assert reader.kv_scales == {0: {"k": 0.5, "v": 0.25}, 1: {"k": 1.5, "v": 1.25}}
    # --quantization fp8 takes the bytes as they are: the fused qkv is q, k, v's rows in order,
    # each with its own scale (no second rounding).
    given = reader.given(CFG)
    assert quantize_fp8(model, given) == 4 * CFG.num_layers
    layer = model.decoder_layers[1].self_attn.qkv_proj
    assert isinstance(layer, Fp8Linear)
    shards = [written[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"]
    want_q = torch.cat([sh[0] for sh in shards])
    assert torch.equal(layer.weight.view(torch.uint8), want_q.view(torch.uint8))
    torch.testing.assert_close(layer.weight_scale, torch.cat([sh[1] for sh in shards]).float())
    down = model.decoder_layers[0].mlp.down_proj
    assert isinstance(down, Fp8Linear)
    want_down = written["model.layers.0.mlp.down_proj.weight"][0]
    assert torch.equal(down.weight.view(torch.uint8), want_down.view(torch.uint8))


def test_block_wise_fp8_and_missing_scales_are_refused(tmp_path: Path) -> None:
    reader = Fp8Checkpoint()
    bad = [("model.layers.0.mlp.down_proj.weight_scale_inv", torch.ones(1, 1))]
    with pytest.raises(Fp8CheckpointError, match="block-wise"):
        list(reader.read(bad))
    lonely = [("model.layers.0.mlp.down_proj.weight", torch.zeros(4, 4).to(fp8.FP8))]
    with pytest.raises(
        Fp8CheckpointError, match=r"no model\.layers\.0\.mlp\.down_proj\.weight_scale"
    ):
        list(Fp8Checkpoint().read(lonely))


def test_a_dense_checkpoint_passes_through() -> None:
    reader = Fp8Checkpoint()
    dense = [("model.norm.weight", torch.ones(3)), ("lm_head.weight", torch.zeros(2, 3))]
    assert [n for n, _ in reader.read(dense)] == ["model.norm.weight", "lm_head.weight"]
    assert not reader.is_fp8 and reader.given(CFG) == {}


def test_the_older_single_kv_scale_sets_both() -> None:
    """vLLM's weight_utils.maybe_remap_kv_scale_name: a deprecated `kv_scale` is K's and V's."""
    reader = Fp8Checkpoint()
    tensors = [
        ("model.layers.3.self_attn.kv_scale", torch.tensor(0.75)),
        ("model.layers.4.self_attn.k_proj.k_scale", torch.tensor(2.0)),
    ]
    assert list(reader.read(tensors)) == []
    assert reader.kv_scales == {3: {"k": 0.75, "v": 0.75}, 4: {"k": 2.0}}
