"""Every shipped engine config passes `config check`, and each keeps its documented shape."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.standin import ensure_on_path
from trtllm_gateway.config.check import check_file, main_check
from trtllm_gateway.config.trtllm_schema import validated_against

CONFIG_DIR = Path(__file__).resolve().parents[2] / "trtllm_gateway" / "config" / "engine_configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CONFIG_DIR / name).read_text())
    return data


def test_the_documented_set_ships() -> None:
    names = {p.name for p in CONFIGS}
    assert {
        "qwen3-agg.yaml",
        "deepseek-r1-prefill.yaml",
        "deepseek-r1-decode.yaml",
        "gpt-oss-120b-prefill.yaml",
        "gpt-oss-120b-decode.yaml",
        "gemma3-vswa-agg.yaml",
        "llava-v1.6-mistral-7b-agg.yaml",
        "llama4-eagle-agg.yaml",
        "llama-3.1-8b-prefill.yaml",
        "llama-3.1-8b-decode.yaml",
    } <= names


@pytest.mark.parametrize("library", [True, False], ids=["TorchLlmArgs", "fallback-schema"])
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_check_passes(
    path: Path, library: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways config check validates (docs/trtllm.md): the stand-in's TorchLlmArgs, and the
    hand-written 1.2 schema when tensorrt_llm is not importable."""
    if library:
        ensure_on_path()
    else:
        for name in [m for m in sys.modules if m.split(".")[0] == "tensorrt_llm"]:
            monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    assert ("TorchLlmArgs" in validated_against({})) is library
    assert main_check([str(path)]) == 0, capsys.readouterr().err
    check_file(path)


def test_qwen3_agg() -> None:
    cfg = _load("qwen3-agg.yaml")
    assert cfg["enable_chunked_prefill"] is True
    assert cfg["cuda_graph_config"]["batch_sizes"]


def test_deepseek_disagg_pair_matches() -> None:
    prefill, decode = _load("deepseek-r1-prefill.yaml"), _load("deepseek-r1-decode.yaml")
    assert prefill["kv_cache_config"]["dtype"] == decode["kv_cache_config"]["dtype"]
    for cfg in (prefill, decode):
        assert cfg["speculative_config"]["decoding_type"] == "MTP"
        assert cfg["cache_transceiver_config"]["backend"]
    assert decode["enable_attention_dp"] is True
    spec = decode["speculative_config"]["num_nextn_predict_layers"]
    assert decode["max_num_tokens"] >= max(decode["cuda_graph_config"]["batch_sizes"]) * (spec + 1)


def test_llama_8b_pair_moves_whole_prompts_through_ucx() -> None:
    """Issue 41 item 6: one GPU each side, the cache transceiver on UCX with a buffer that holds
    the longest prompt's KV (docs/source/features/disagg-serving.md: max_tokens_in_buffer at
    least the longest input), the same KV settings on both sides, overlap off on prefill."""
    prefill, decode = _load("llama-3.1-8b-prefill.yaml"), _load("llama-3.1-8b-decode.yaml")
    for cfg in (prefill, decode):
        ctc = cfg["cache_transceiver_config"]
        assert ctc["backend"] == "UCX"
        assert ctc["max_tokens_in_buffer"] >= prefill["max_seq_len"]
        assert cfg.get("tensor_parallel_size", 1) == 1
    assert prefill["kv_cache_config"].get("dtype") == decode["kv_cache_config"].get("dtype")
    assert prefill["kv_cache_config"].get("tokens_per_block") == decode["kv_cache_config"].get(
        "tokens_per_block"
    )
    assert prefill["disable_overlap_scheduler"] is True
    assert decode["max_num_tokens"] >= 256  # the decode side's own short prefills


def test_gpt_oss_pair() -> None:
    prefill, decode = _load("gpt-oss-120b-prefill.yaml"), _load("gpt-oss-120b-decode.yaml")
    assert prefill["enable_attention_dp"] is False
    assert prefill["enable_chunked_prefill"] is True
    assert prefill["moe_config"]["backend"] == "CUTLASS"
    assert prefill["cache_transceiver_config"]["backend"] == "UCX"
    assert decode["enable_attention_dp"] is True
    assert decode["disable_overlap_scheduler"] is False
    assert (
        decode["cuda_graph_config"]["max_batch_size"]
        > prefill["cuda_graph_config"]["max_batch_size"]
    )
    assert prefill["kv_cache_config"]["dtype"] == decode["kv_cache_config"]["dtype"]


def test_gemma3_variable_sliding_window() -> None:
    window = _load("gemma3-vswa-agg.yaml")["kv_cache_config"]["max_attention_window"]
    assert len(set(window)) > 1


def test_llama4_eagle() -> None:
    spec = _load("llama4-eagle-agg.yaml")["speculative_config"]
    assert spec["decoding_type"] in ("Eagle", "Eagle3")
    assert spec["speculative_model_dir"]


def test_llava_keeps_prefix_reuse() -> None:
    """1.2's llm.py hashes each image into the block keys (input_processor_with_hash), so reuse
    cannot mix images; the config no longer turns it off (issue 21 item 7)."""
    assert _load("llava-v1.6-mistral-7b-agg.yaml")["kv_cache_config"].get(
        "enable_block_reuse", True
    )
