"""What TensorRT-LLM 1.2's AutoDeploy backend (`--trtllm-backend autodeploy`) takes.

Its `LLM()` validates with `tensorrt_llm/_torch/auto_deploy/llm_args.py` `LlmArgs(AutoDeployConfig,
BaseLlmArgs, BaseSettings)`, `extra="forbid"` (1.2 window): the fields of BaseLlmArgs
(llmapi/llm_args.py) and of AutoDeployConfig, and a few of its own. TorchLlmArgs' fields are not
among them, so `enable_iter_perf_stats` (which the gateway always sends for its gauges),
`cuda_graph_config` and `stream_interval` would fail the start; engine/trtllm/llm_args.py drops
every key outside AUTODEPLOY_ACCEPTS with a warning (and turns cuda_graph_config's batch_sizes
into AutoDeploy's cuda_graph_batch_sizes). AutoDeployConfig's own defaults are not
TorchLlmArgs': a 512-token sequence and 8 requests at once unless max_seq_len / max_batch_size
(--max-model-len / --max-batch-size) are given; engine/trtllm/engine.py reports those.
"""

from __future__ import annotations

AUTODEPLOY_MAX_SEQ_LEN = 512  # AutoDeployConfig.max_seq_len's default
AUTODEPLOY_MAX_BATCH_SIZE = 8  # AutoDeployConfig.max_batch_size's default

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
        "decoding_config", "backend", "return_perf_metrics", "orchestrator_type",
    }
)  # fmt: skip

AUTODEPLOY_OWN = frozenset(
    {
        "model_factory", "model_kwargs", "skip_loading_weights", "tokenizer_kwargs",
        "disable_overlap_scheduler", "world_size", "runtime", "device", "kv_cache_dtype",
        "mode", "transforms", "attn_backend", "free_mem_ratio", "compile_backend",
        "cuda_graph_batch_sizes", "attn_page_size", "build_config",
        "garbage_collection_gen0_threshold",
    }
)  # fmt: skip

AUTODEPLOY_ACCEPTS = _BASE_LLM_ARGS | AUTODEPLOY_OWN
