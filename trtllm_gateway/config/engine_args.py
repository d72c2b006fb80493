"""Engine-argument layering: built-in defaults < CLI flags < --extra-engine-args < --override.

Each layer is a plain dict; later layers win and nested dicts merge key by key at every depth,
so a YAML `kv_cache_config: {dtype: fp8}` keeps the flags' `free_gpu_memory_fraction`. (trtllm-
serve 1.2's own --extra_llm_api_options merge, update_llm_args_with_extra_dict in
tensorrt_llm/llmapi/llm_args.py, is `llm_args | llm_args_dict` at the top level except for
kv_cache_config, whose keys it merges one level deep (`base_kv_config | yaml_kv_config`); any
other YAML section, e.g. scheduler_config, replaces the flags' section whole there. The gateway
merges every section key by key instead, so a YAML keeps the flags' keys it does not name.)
Every failure is an `EngineArgsError` whose one-line message names the source (file or flag),
the key path and the reason; never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from trtllm_gateway.config.engine import DEFAULT_MODEL, EngineConfig
from trtllm_gateway.config.trtllm import TrtllmConfig, lora_module
from trtllm_gateway.config.trtllm_schema import trtllm_args_errors

Layer = tuple[str, dict[str, Any]]  # (source name for error messages, args)

OVERRIDE_SOURCE = "--override-engine-args"
TRTLLM_TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block's default (llm_args.py)


class EngineArgsError(ValueError):
    """Engine arguments that cannot be used; str() is one line naming source, key and reason."""


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return base updated by override; dicts on both sides merge recursively, the rest replaces.

    An explicit `None` in override replaces (that is how a YAML disables `cuda_graph_config`).
    """
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(old, value)
        else:
            merged[key] = value
    return merged


def load_engine_args_file(path: Path) -> dict[str, Any]:
    """Read an engine-args YAML (a mapping at top level); EngineArgsError on any problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EngineArgsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise EngineArgsError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise EngineArgsError(f"{path}: expected a mapping of LLM args, got {type(data).__name__}")
    return data


def parse_override(text: str) -> dict[str, Any]:
    """Parse the --override-engine-args JSON object; EngineArgsError on any problem."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineArgsError(
            f"{OVERRIDE_SOURCE}: invalid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise EngineArgsError(
            f"{OVERRIDE_SOURCE}: expected a JSON object, got {type(data).__name__}"
        )
    return data


def trtllm_default_args(engine: EngineConfig, trtllm: TrtllmConfig) -> dict[str, Any]:
    """The built-in layer: what the gateway always wants from TensorRT-LLM unless told otherwise."""
    args: dict[str, Any] = {
        # No dynamic_batch_config: only the TensorRT backend uses it (the PyTorch one ignores it).
        "scheduler_config": {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"},
        # get_stats_async yields nothing without it; /metrics needs the gauges.
        "enable_iter_perf_stats": True,
    }
    if engine.mode in ("prefill", "decode"):
        args["cache_transceiver_config"] = {
            "backend": trtllm.cache_transceiver_backend,
            # Without it a context request whose KV no decode fetches holds its blocks forever.
            "kv_transfer_timeout_ms": int(engine.kv_handoff_timeout * 1000),
        }
    return args


def trtllm_cli_args(engine: EngineConfig, trtllm: TrtllmConfig) -> dict[str, Any]:
    """The flags layer: the engine and TensorRT-LLM flags mapped onto LLM arg names."""
    kv_cache: dict[str, Any] = {
        "free_gpu_memory_fraction": engine.kv_cache_fraction,
        "enable_block_reuse": engine.enable_prefix_caching,
    }
    if "block_size" in engine.model_fields_set:
        kv_cache["tokens_per_block"] = engine.block_size
    if engine.fp8_kv:  # llm_args.py KvCacheConfig.dtype: "fp8" (syncs kv_cache_quant_algo)
        kv_cache["dtype"] = "fp8"
    if trtllm.enable_kv_events:
        kv_cache["event_buffer_max_size"] = 1024
        kv_cache["enable_block_reuse"] = True  # KV events need block reuse
    if trtllm.enable_kv_events and trtllm.trtllm_backend != "pytorch":
        raise EngineArgsError(
            "--enable-kv-events: KV cache events need --trtllm-backend pytorch "
            f"(the {trtllm.trtllm_backend} backend publishes none)"
        )
    args: dict[str, Any] = {
        "backend": trtllm.trtllm_backend,
        "tensor_parallel_size": trtllm.tensor_parallel_size,
        "pipeline_parallel_size": trtllm.pipeline_parallel_size,
        "enable_attention_dp": trtllm.enable_attention_dp,
        "max_beam_width": trtllm.max_beam_width,
        "trust_remote_code": trtllm.trust_remote_code,
        "dtype": engine.dtype,
        "load_format": engine.load_format,
        "kv_cache_config": kv_cache,
        # Prefill mode forces it (refuse_for_mode says why; the engine logs it).
        "disable_overlap_scheduler": trtllm.disable_overlap_scheduler or engine.mode == "prefill",
    }
    # The built-in engine's own defaults (2048 tokens a step, no chunking, 64 requests) would
    # cap TensorRT-LLM's (8192, 2048 requests) silently. Send them only if given.
    for part, name in (
        (engine, "max_num_tokens"),
        (trtllm, "enable_chunked_prefill"),
        (engine, "max_batch_size"),
    ):
        if name in part.model_fields_set:
            args[name] = getattr(part, name)
    if "stream_interval" in engine.model_fields_set:
        args["stream_interval"] = engine.stream_interval
    if engine.model != DEFAULT_MODEL:
        args["model"] = engine.model
    if engine.tokenizer is not None:
        args["tokenizer"] = engine.tokenizer
    if trtllm.moe_expert_parallel_size is not None:
        args["moe_expert_parallel_size"] = trtllm.moe_expert_parallel_size
    if engine.max_model_len is not None:
        args["max_seq_len"] = engine.max_model_len
    if not engine.cuda_graphs:
        args["cuda_graph_config"] = None
    elif trtllm.cuda_graph_batch_sizes:
        # The list alone: 1.2 refuses it with a max_batch_size it would not generate itself.
        args["cuda_graph_config"] = {"batch_sizes": sorted(set(trtllm.cuda_graph_batch_sizes))}
    if trtllm.guided_decoding_backend is not None:
        args["guided_decoding_backend"] = trtllm.guided_decoding_backend
    if trtllm.lora_modules:
        # PyTorch backend: without lora_config no LoRA manager exists and TensorRT-LLM silently
        # ignores every lora_request (executor/base_worker.py); lora_dir gives the target modules.
        paths = [lora_module(entry)[1] for entry in trtllm.lora_modules]
        n = len(paths)
        args["lora_config"] = {"lora_dir": paths, "max_loras": n, "max_cpu_loras": n}
    return args


def trtllm_layers(engine: EngineConfig, trtllm: TrtllmConfig) -> list[Layer]:
    """All layers for --engine trtllm, lowest precedence first (files and JSON read here)."""
    flags = trtllm_cli_args(engine, trtllm)
    layers: list[Layer] = [
        ("built-in defaults", trtllm_default_args(engine, trtllm)),
        ("command-line flags", flags),
    ]
    if trtllm.extra_engine_args is not None:
        path = trtllm.extra_engine_args
        layers.append((str(path), load_engine_args_file(path)))
    if trtllm.override_engine_args is not None:
        layers.append((OVERRIDE_SOURCE, parse_override(trtllm.override_engine_args)))
    if engine.num_kv_blocks is not None:
        # Blocks of the engine's own size: the final tokens_per_block (a YAML may set it),
        # else TensorRT-LLM's default, never the built-in engine's 16.
        block = TRTLLM_TOKENS_PER_BLOCK
        for _, args in layers:
            kv = args.get("kv_cache_config")
            if isinstance(kv, Mapping) and isinstance(kv.get("tokens_per_block"), int):
                block = kv["tokens_per_block"]
        flags["kv_cache_config"]["max_tokens"] = engine.num_kv_blocks * block
    return layers


def merge_and_validate(layers: list[Layer]) -> dict[str, Any]:
    """Deep-merge the layers, validate (config.trtllm_schema: TorchLlmArgs itself when
    tensorrt_llm imports, else the 1.2 schema), return the dict.

    Raises EngineArgsError naming the layer that set the first bad key (or the last layer that
    touched its parent, for a missing field).
    """
    merged: dict[str, Any] = {}
    for _, args in layers:
        merged = deep_merge(merged, args)
    errors = trtllm_args_errors(merged)
    if errors:
        raise EngineArgsError(describe_errors(errors, layers))
    return merged


def resolve_trtllm_args(engine: EngineConfig, trtllm: TrtllmConfig) -> dict[str, Any]:
    """The final LLM args for these configs; the one entry point serve and `config show` use."""
    layers = trtllm_layers(engine, trtllm)
    args = merge_and_validate(layers)
    refuse_for_mode(args, engine.mode, layers)
    return args


def refuse_for_mode(args: Mapping[str, Any], mode: str, layers: list[Layer]) -> None:
    """What TensorRT-LLM 1.2 accepts at start but kills its executor worker over on the first
    disaggregated request (executor/base_worker.py `_enqueue_request`, before its `try`;
    executor/worker.py `worker_main` catches only RequestError):
    - a prefill instance with the overlap scheduler on: "Context only requests are not supported
      in pytorch backend when overlap is enabled." (a ValueError). The flags layer forces
      `disable_overlap_scheduler: true` in prefill mode; a YAML or override that sets it false
      is refused here.
    - a prefill or decode instance without `cache_transceiver_config` (a YAML's `null`): an
      assert ("kv_cache_transceiver is disabled").
    """
    if mode == "prefill" and not args.get("disable_overlap_scheduler"):
        where = source_of(["disable_overlap_scheduler"], layers)
        raise EngineArgsError(
            f"{where}: disable_overlap_scheduler: --mode prefill needs true (TensorRT-LLM 1.2's "
            "worker exits on the first context-only request with the overlap scheduler on)"
        )
    if mode in ("prefill", "decode") and args.get("cache_transceiver_config") is None:
        where = source_of(["cache_transceiver_config"], layers)
        raise EngineArgsError(
            f"{where}: cache_transceiver_config: --mode {mode} needs one (TensorRT-LLM 1.2's "
            "worker asserts 'kv_cache_transceiver is disabled' on the first disaggregated "
            "request and exits)"
        )


def describe_errors(errors: list[dict[str, Any]], layers: list[Layer]) -> str:
    """One line per bad key: `<source>: <key.path>: <reason>`, joined with '; '."""
    parts = []
    for err in errors:
        loc = [str(p) for p in err["loc"] if not _is_union_tag(p)]
        key = ".".join(loc) or "<root>"
        reason = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{source_of(loc, layers)}: {key}: {reason}")
    return "; ".join(parts)


def source_of(loc: list[str], layers: list[Layer]) -> str:
    """The last layer that sets the deepest existing prefix of loc."""
    for depth in range(len(loc), 0, -1):
        for name, args in reversed(layers):
            if _has_path(args, loc[:depth]):
                return name
    return layers[-1][0] if layers else "engine args"


def _has_path(args: Mapping[str, Any], path: list[str]) -> bool:
    node: Any = args
    for part in path:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def _is_union_tag(part: int | str) -> bool:
    # Discriminated unions add the tag ("MTP", "Eagle", ...) to the location; hide it.
    return isinstance(part, str) and part[:1].isupper()
