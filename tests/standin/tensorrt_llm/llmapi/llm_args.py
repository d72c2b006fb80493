"""Stand-in `tensorrt_llm.llmapi.llm_args`: strict config models and the accepted LLM kwargs."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CapacitySchedulerPolicy(StrEnum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class ContextChunkingPolicy(StrEnum):
    FIRST_COME_FIRST_SERVED = "FIRST_COME_FIRST_SERVED"
    EQUAL_PROGRESS = "EQUAL_PROGRESS"


class DynamicBatchConfig(StrictBaseModel):
    # 1.0/1.1: all three required (no defaults).
    enable_batch_size_tuning: bool
    enable_max_num_tokens_tuning: bool
    dynamic_batch_moving_average_window: int


class SchedulerConfig(StrictBaseModel):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: ContextChunkingPolicy | None = None
    dynamic_batch_config: DynamicBatchConfig | None = None


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
        "fail_fast_on_attention_window_too_large",
    ]
)
"""`TorchLlmArgs` field names: every `LLM(**kwargs)` key must be one of these (§1.2, §1.3)."""

NESTED_MODELS: dict[str, type[StrictBaseModel]] = {
    "kv_cache_config": KvCacheConfig,
    "scheduler_config": SchedulerConfig,
    "cuda_graph_config": CudaGraphConfig,
    "cache_transceiver_config": CacheTransceiverConfig,
}
