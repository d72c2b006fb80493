"""Stand-in AutoDeploy LLM: takes only what AutoDeploy's own LlmArgs takes, with its defaults.

Upstream (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/auto_deploy/llm_args.py, 1.2 window):
`class LlmArgs(AutoDeployConfig, BaseLlmArgs, BaseSettings)` with `extra="forbid"`: the fields
of AutoDeployConfig and of llmapi/llm_args.py's BaseLlmArgs, plus build_config (default only),
backend ("_autodeploy"), gpus_per_node and garbage_collection_gen0_threshold. TorchLlmArgs' own
fields (enable_iter_perf_stats, cuda_graph_config, stream_interval, moe_config, ...) are not
among them: passing one is a ValidationError at LLM(). The parallel sizes and cp_config are
refused unless they are the defaults (`ensure_no_custom_parallel_config`); the stand-in refuses
the keys outright (the harsher reading). AutoDeployConfig's defaults differ from TorchLlmArgs':
max_seq_len 512, max_batch_size 8 (a longer request is refused here, as the engine is sized for
512 tokens a sequence).
"""

from __future__ import annotations

from typing import Any

from tensorrt_llm.llmapi.llm import LLM as _TorchLLM
from tensorrt_llm.llmapi.llm_args import TORCH_LLM_ARGS

_UNSUPPORTED = frozenset(
    {
        "build_config",
        "scheduler_config",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "context_parallel_size",
        "moe_cluster_parallel_size",
        "moe_tensor_parallel_size",
        "moe_expert_parallel_size",
        "enable_attention_dp",
        "cp_config",
    }
)

# llmapi/llm_args.py BaseLlmArgs (1.2 window), field names.
_BASE_LLM_ARGS = frozenset(
    {
        "model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
        "tensor_parallel_size", "dtype", "revision", "tokenizer_revision",
        "pipeline_parallel_size", "context_parallel_size", "gpus_per_node",
        "moe_cluster_parallel_size", "moe_tensor_parallel_size", "moe_expert_parallel_size",
        "enable_attention_dp", "enable_lm_head_tp_in_adp", "cp_config", "load_format",
        "fail_fast_on_attention_window_too_large", "enable_lora", "lora_config",
        "kv_cache_config", "enable_chunked_prefill", "guided_decoding_backend",
        "batched_logits_processor", "iter_stats_max_iterations", "request_stats_max_iterations",
        "peft_cache_config", "scheduler_config", "cache_transceiver_config",
        "sparse_attention_config", "speculative_config", "max_batch_size", "max_input_len",
        "max_seq_len", "max_beam_width", "max_num_tokens", "gather_generation_logits",
        "num_postprocess_workers", "postprocess_tokenizer_dir", "reasoning_parser",
        "decoding_config", "mpi_session", "_mpi_session", "backend", "return_perf_metrics",
        "orchestrator_type",
    }
)  # fmt: skip

# _torch/auto_deploy/llm_args.py AutoDeployConfig, and LlmArgs' own additions.
_AUTODEPLOY_CONFIG = frozenset(
    {
        "model", "model_factory", "model_kwargs", "skip_loading_weights", "tokenizer",
        "tokenizer_kwargs", "skip_tokenizer_init", "disable_overlap_scheduler", "world_size",
        "runtime", "device", "kv_cache_dtype", "kv_cache_config", "max_beam_width",
        "enable_chunked_prefill", "mode", "transforms", "attn_backend", "free_mem_ratio",
        "compile_backend", "cuda_graph_batch_sizes", "max_input_len", "max_num_tokens",
        "max_seq_len", "max_batch_size", "attn_page_size", "yaml_default",
        "build_config", "backend", "gpus_per_node", "garbage_collection_gen0_threshold",
    }
)  # fmt: skip

ACCEPTED = _BASE_LLM_ARGS | _AUTODEPLOY_CONFIG
MAX_SEQ_LEN = 512  # AutoDeployConfig.max_seq_len's default
MAX_BATCH_SIZE = 8  # AutoDeployConfig.max_batch_size's default


class LLM(_TorchLLM):
    def __init__(self, model: str, **kwargs: Any) -> None:
        bad = sorted(_UNSUPPORTED & kwargs.keys())
        if bad:
            raise ValueError(f"AutoDeploy LLM got unsupported arguments: {bad}")
        extra = sorted(kwargs.keys() - ACCEPTED)
        if extra:
            raise ValueError(
                f"{len(extra)} validation errors for LlmArgs: {extra}: "
                "Extra inputs are not permitted [type=extra_forbidden]"
            )
        kwargs.setdefault("max_seq_len", MAX_SEQ_LEN)
        kwargs.setdefault("max_batch_size", MAX_BATCH_SIZE)
        # AutoDeploy's own knobs (cuda_graph_batch_sizes, world_size, ...): nothing to model.
        own = _AUTODEPLOY_CONFIG - _BASE_LLM_ARGS - TORCH_LLM_ARGS
        super().__init__(model, **{k: v for k, v in kwargs.items() if k not in own})
