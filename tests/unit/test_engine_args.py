"""Engine-argument layering: precedence, deep merge, one-line errors, config check/show."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from trtllm_gateway.config.check import main_check, main_show
from trtllm_gateway.config.engine_args import (
    EngineArgsError,
    deep_merge,
    load_engine_args_file,
    parse_override,
    resolve_trtllm_args,
)
from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.config.settings import Settings


@pytest.fixture(autouse=True)
def _without_tensorrt_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests pin the fallback schema: hide an importable tensorrt_llm (the stand-in)."""
    for name in [m for m in sys.modules if m.split(".")[0] == "tensorrt_llm"] + ["tensorrt_llm"]:
        monkeypatch.setitem(sys.modules, name, None)


def _settings(tmp_path: Path, yaml_text: str | None = None, **kw: object) -> GatewayConfig:
    if yaml_text is not None:
        path = tmp_path / "engine.yaml"
        path.write_text(yaml_text)
        kw["extra_engine_args"] = path
    return Settings(engine="trtllm", model="/models/m", **kw).parts()  # type: ignore[arg-type]


def _resolve(config: GatewayConfig) -> dict[str, Any]:
    return resolve_trtllm_args(config.engine, config.trtllm)


def test_deep_merge_merges_nested_dicts_and_replaces_the_rest() -> None:
    base = {"a": 1, "kv": {"x": 1, "y": {"z": 1}}, "lst": [1, 2]}
    merged = deep_merge(base, {"kv": {"y": {"w": 2}}, "lst": [3], "cg": None})
    assert merged == {"a": 1, "kv": {"x": 1, "y": {"z": 1, "w": 2}}, "lst": [3], "cg": None}
    assert base["kv"] == {"x": 1, "y": {"z": 1}}  # inputs untouched


def test_defaults_have_a_scheduler_without_dynamic_batch_config(tmp_path: Path) -> None:
    """DynamicBatchConfig "only applies for the TensorRT backend" (1.2 llm_args.py)."""
    args = _resolve(_settings(tmp_path))
    assert args["scheduler_config"] == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}
    assert args["enable_iter_perf_stats"] is True
    assert "cache_transceiver_config" not in args


def test_cli_flags_map_to_llm_args(tmp_path: Path) -> None:
    args = _resolve(
        _settings(
            tmp_path,
            tensor_parallel_size=4,
            moe_expert_parallel_size=4,
            enable_attention_dp=True,
            max_model_len=8192,
            kv_cache_fraction=0.5,
            enable_chunked_prefill=True,
            cuda_graph_batch_sizes=[8, 1, 4],
            guided_decoding_backend="xgrammar",
            enable_kv_events=True,
            trust_remote_code=True,
        )
    )
    assert args["tensor_parallel_size"] == 4
    assert args["moe_expert_parallel_size"] == 4
    assert args["enable_attention_dp"] is True
    assert args["max_seq_len"] == 8192
    assert args["kv_cache_config"]["free_gpu_memory_fraction"] == 0.5
    assert args["kv_cache_config"]["event_buffer_max_size"] > 0
    assert args["cuda_graph_config"] == {"batch_sizes": [1, 4, 8]}  # 1.2 refuses both
    assert args["guided_decoding_backend"] == "xgrammar"
    assert args["model"] == "/models/m"


def test_no_cuda_graphs_flag_disables_them(tmp_path: Path) -> None:
    assert _resolve(_settings(tmp_path, cuda_graphs=False))["cuda_graph_config"] is None


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_disagg_modes_get_a_cache_transceiver(tmp_path: Path, mode: str) -> None:
    args = _resolve(_settings(tmp_path, mode=mode, cache_transceiver_backend="UCX"))
    assert args["cache_transceiver_config"] == {"backend": "UCX", "kv_transfer_timeout_ms": 30000}


def test_precedence_defaults_cli_yaml_override(tmp_path: Path) -> None:
    yaml_text = "max_batch_size: 16\nmax_num_tokens: 4096\nkv_cache_config:\n  dtype: fp8\n"
    settings = _settings(
        tmp_path,
        yaml_text,
        max_batch_size=32,
        kv_cache_fraction=0.7,
        override_engine_args=json.dumps({"max_num_tokens": 1024, "kv_cache_config": {}}),
    )
    args = _resolve(settings)
    assert args["max_batch_size"] == 16  # YAML beats the flag
    assert args["max_num_tokens"] == 1024  # JSON beats YAML
    # Nested merge: YAML's dtype joins the flag's fraction instead of replacing the section.
    assert args["kv_cache_config"]["dtype"] == "fp8"
    assert args["kv_cache_config"]["free_gpu_memory_fraction"] == 0.7
    assert args["scheduler_config"]["capacity_scheduler_policy"] == "GUARANTEED_NO_EVICT"


def test_yaml_can_disable_a_section_with_null(tmp_path: Path) -> None:
    args = _resolve(_settings(tmp_path, "cuda_graph_config: null\n"))
    assert args["cuda_graph_config"] is None


def test_unknown_yaml_key_names_file_and_key(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "kv_cache_config:\n  free_gpu_mem: 0.5\n")
    with pytest.raises(EngineArgsError) as info:
        _resolve(settings)
    message = str(info.value)
    assert str(tmp_path / "engine.yaml") in message
    assert "kv_cache_config.free_gpu_mem: unknown key" in message
    assert "\n" not in message


def test_wrong_type_names_source_key_and_reason(tmp_path: Path) -> None:
    settings = _settings(tmp_path, override_engine_args='{"max_batch_size": "many"}')
    with pytest.raises(EngineArgsError, match=r"--override-engine-args: max_batch_size: .*int"):
        _resolve(settings)


def test_strict_types_reject_quoted_numbers(tmp_path: Path) -> None:
    with pytest.raises(EngineArgsError, match="tensor_parallel_size"):
        _resolve(_settings(tmp_path, "tensor_parallel_size: '4'\n"))


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kv_cache_config:\n  dtype: [fp8\n")
    with pytest.raises(EngineArgsError, match=r"bad\.yaml: invalid YAML \(line \d+"):
        load_engine_args_file(path)


def test_yaml_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(EngineArgsError, match="expected a mapping"):
        load_engine_args_file(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(EngineArgsError, match="cannot read"):
        load_engine_args_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("text", "reason"), [("{bad", "invalid JSON"), ("[1, 2]", "expected a JSON object")]
)
def test_invalid_override_json(text: str, reason: str) -> None:
    with pytest.raises(EngineArgsError, match=f"--override-engine-args: {reason}"):
        parse_override(text)


def test_speculative_config_union_is_strict(tmp_path: Path) -> None:
    good = "speculative_config:\n  decoding_type: MTP\n  num_nextn_predict_layers: 2\n"
    assert _resolve(_settings(tmp_path, good))["speculative_config"]["decoding_type"]
    bad = "speculative_config:\n  decoding_type: MTP\n  max_draft: 2\n"
    with pytest.raises(EngineArgsError, match=r"speculative_config\.max_draft: unknown key"):
        _resolve(_settings(tmp_path, bad))


def test_config_check_prints_merged_args(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("kv_cache_config:\n  dtype: fp8\n")
    assert main_check([str(path)]) == 0
    out = capsys.readouterr().out
    assert f"# OK {path}" in out
    assert "dtype: fp8" in out
    assert "free_gpu_memory_fraction: 0.9" in out


def test_config_check_fails_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("bogus_key: 1\n")
    assert main_check([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"error: {path}: bogus_key: unknown key"


def test_config_check_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_check([]) == 2
    assert "usage" in capsys.readouterr().err


def test_config_show_takes_serve_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--engine", "trtllm", "--model", "/m", "--mode", "decode"]
    argv += ["--override-engine-args", '{"max_batch_size": 8}']
    assert main_show(argv) == 0
    out = capsys.readouterr().out
    assert "max_batch_size: 8" in out
    assert "cache_transceiver_config:" in out


def test_config_show_bad_flag_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_show(["--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:")
    assert err.count("\n") == 1
