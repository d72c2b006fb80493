"""Stand-in `tensorrt_llm.llmapi.llm_args`: strict config models and `TorchLlmArgs`.

Keys as in TensorRT-LLM 1.2's llm_args.py (PyTorch backend): configs are `extra="forbid"`
but, like the real StrictBaseModel, not strict about types ("8" is coerced to 8).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CapacitySchedulerPolicy(StrEnum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class ContextChunkingPolicy(StrEnum):
    FIRST_COME_FIRST_SERVED = "FIRST_COME_FIRST_SERVED"
    EQUAL_PROGRESS = "EQUAL_PROGRESS"


class WaitingQueuePolicy(StrEnum):
    FCFS = "FCFS"


class DynamicBatchConfig(StrictBaseModel):
    # 1.0/1.1: all three required (no defaults). The PyTorch backend ignores it: "This only
    # applies for the TensorRT backend and cannot currently be used with the PyTorch backend."
    enable_batch_size_tuning: bool
    enable_max_num_tokens_tuning: bool
    dynamic_batch_moving_average_window: int


class SchedulerConfig(StrictBaseModel):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: ContextChunkingPolicy | None = None
    dynamic_batch_config: DynamicBatchConfig | None = None
    waiting_queue_policy: WaitingQueuePolicy = WaitingQueuePolicy.FCFS


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: float | None = None
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = 0
    attention_dp_events_gather_period_ms: int = 5
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    max_gpu_total_bytes: int = 0
    dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    tokens_per_block: int = 32


class CudaGraphConfig(StrictBaseModel):
    batch_sizes: list[int] | None = None
    max_batch_size: int = 0
    enable_padding: bool = False


class CacheTransceiverConfig(StrictBaseModel):
    backend: Literal["DEFAULT", "UCX", "NIXL", "MPI", "MOONCAKE"] | None = None
    max_tokens_in_buffer: int | None = None
    kv_transfer_timeout_ms: int | None = None
    kv_transfer_sender_future_timeout_ms: int | None = 1000


class MoeConfig(StrictBaseModel):
    backend: Literal[
        "AUTO", "CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA", "TRITON"
    ] = "AUTO"
    max_num_tokens: int | None = None
    load_balancer: Any = None
    disable_finalize_fusion: bool = False
    use_low_precision_moe_combine: bool = False


class Nvfp4GemmConfig(StrictBaseModel):
    allowed_backends: list[Literal["cutlass", "cublaslt", "cutedsl", "cuda_core"]] = [
        "cutlass",
        "cublaslt",
        "cuda_core",
    ]


TORCH_LLM_ARGS = frozenset(
    [
        "model",
        "tokenizer",
        "tokenizer_mode",
        "skip_tokenizer_init",
        "trust_remote_code",
        "dtype",
        "revision",
        "tokenizer_revision",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "context_parallel_size",
        "gpus_per_node",
        "moe_cluster_parallel_size",
        "moe_tensor_parallel_size",
        "moe_expert_parallel_size",
        "enable_attention_dp",
        "enable_lm_head_tp_in_adp",
        "pp_partition",
        "cp_config",
        "load_format",
        "enable_lora",
        "lora_config",
        "peft_cache_config",
        "kv_cache_config",
        "enable_chunked_prefill",
        "guided_decoding_backend",
        "batched_logits_processor",
        "iter_stats_max_iterations",
        "request_stats_max_iterations",
        "scheduler_config",
        "cache_transceiver_config",
        "sparse_attention_config",
        "speculative_config",
        "max_batch_size",
        "max_input_len",
        "max_seq_len",
        "max_beam_width",
        "max_num_tokens",
        "gather_generation_logits",
        "num_postprocess_workers",
        "postprocess_tokenizer_dir",
        "reasoning_parser",
        "otlp_traces_endpoint",
        "return_perf_metrics",
        "perf_metrics_max_requests",
        "orchestrator_type",
        "cuda_graph_config",
        "disable_overlap_scheduler",
        "attention_dp_config",
        "moe_config",
        "attn_backend",
        "sampler_type",
        "enable_iter_perf_stats",
        "enable_iter_req_stats",
        "print_iter_log",
        "batch_wait_timeout_ms",
        "batch_wait_timeout_iters",
        "batch_wait_max_tokens_ratio",
        "torch_compile_config",
        "enable_autotuner",
        "enable_layerwise_nvtx_marker",
        "enable_min_latency",
        "garbage_collection_gen0_threshold",
        "stream_interval",
        "force_dynamic_quantization",
        "allreduce_strategy",
        "checkpoint_loader",
        "checkpoint_format",
        "kv_connector_config",
        "mm_encoder_only",
        "ray_worker_extension_cls",
        "enable_sleep",
        "max_stats_len",
        "custom_tokenizer",
        "model_kwargs",
        "env_overrides",
        "nvfp4_gemm_config",
        "backend",
    ]
)
"""`TorchLlmArgs` field names: every `LLM(**kwargs)` key must be one of these (§1.2, §1.3).
`fail_fast_on_attention_window_too_large` is TrtLlmArgs' (the TensorRT backend), not here."""

NESTED_MODELS: dict[str, type[StrictBaseModel]] = {
    "kv_cache_config": KvCacheConfig,
    "scheduler_config": SchedulerConfig,
    "cuda_graph_config": CudaGraphConfig,
    "cache_transceiver_config": CacheTransceiverConfig,
    "moe_config": MoeConfig,
    "nvfp4_gemm_config": Nvfp4GemmConfig,
}

_INT_FIELDS = (
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
    "max_input_len",
    "max_beam_width",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "stream_interval",
)
_BOOL_FIELDS = (
    "enable_chunked_prefill",
    "enable_attention_dp",
    "enable_iter_perf_stats",
    "disable_overlap_scheduler",
    "trust_remote_code",
)

_FIELDS: dict[str, Any] = {
    **dict.fromkeys(TORCH_LLM_ARGS, (Any, None)),
    **dict.fromkeys(_INT_FIELDS, (int | None, None)),
    **dict.fromkeys(_BOOL_FIELDS, (bool, False)),
    "env_overrides": (dict[str, str] | None, None),
    "model_kwargs": (dict[str, Any] | None, None),
    **{name: (cls | None, None) for name, cls in NESTED_MODELS.items()},
}
TorchLlmArgs: type[BaseModel] = create_model(
    "TorchLlmArgs",
    __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True),
    **_FIELDS,
)
"""The real class's field set and nested config types; validators that need a GPU are not
reproduced (dtype checks CUDA, the tokenizer is loaded)."""
