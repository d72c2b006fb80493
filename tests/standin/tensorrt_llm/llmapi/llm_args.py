"""Stand-in `tensorrt_llm.llmapi.llm_args`: strict config models and `TorchLlmArgs`.

Keys as in TensorRT-LLM 1.2's llm_args.py (PyTorch backend): configs are `extra="forbid"`
but, like the real StrictBaseModel, not strict about types ("8" is coerced to 8).

Read from NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py of the 1.2 window (the v1.2.0 tag
itself could not be fetched here: the repository snapshot is over the size limit). What later
versions changed, 1.2.0 modelled:
- `DynamicBatchConfig`: all three fields required in 1.2 (`Field(description=...)`, no
  default); 1.3 gives them defaults (True, False, 128).
- `SchedulerConfig.waiting_queue_policy` / `WaitingQueuePolicy`: 1.3 only; 1.2's SchedulerConfig
  is extra="forbid" without it, so the key is refused.
- `CacheTransceiverConfig.kv_transfer_timeout_ms`: `Field(default=None, gt=0)`.
"""

from __future__ import annotations

import math
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)


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
    # 1.2 (llm_args.py `DynamicBatchConfig`): every field required; 1.3 defaults them.
    enable_batch_size_tuning: bool
    enable_max_num_tokens_tuning: bool
    dynamic_batch_moving_average_window: int


class SchedulerConfig(StrictBaseModel):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: ContextChunkingPolicy | None = None
    dynamic_batch_config: DynamicBatchConfig | None = None
    # No waiting_queue_policy: SchedulerConfig gained it (WaitingQueuePolicy.FCFS) in 1.3.


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[PositiveInt] | None = Field(None, min_length=1)
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = Field(0.9, ge=0, le=1)
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: float | None = None
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = 0
    attention_dp_events_gather_period_ms: int = 5
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    max_gpu_total_bytes: NonNegativeInt = 0
    dtype: str = "auto"
    mamba_ssm_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    tokens_per_block: int = 32


class CudaGraphConfig(StrictBaseModel):
    batch_sizes: list[int] | None = None
    max_batch_size: int = Field(0, ge=0)
    enable_padding: bool = False

    @staticmethod
    def generated_batch_sizes(max_batch_size: int, enable_padding: bool) -> list[int]:
        """CudaGraphConfig._generate_cuda_graph_batch_sizes (llmapi/llm_args.py, 1.2 period),
        its last step included: "Add max_batch_size if not already included"."""
        if enable_padding:
            sizes = [1, 2, 4] + [i * 8 for i in range(1, 17)]
        else:
            sizes = [*range(1, 32), 32, 64, 128]
        sizes += [2**i for i in range(8, math.ceil(math.log(max_batch_size, 2)))]
        sizes = sorted(s for s in sizes if s <= max_batch_size)
        if max_batch_size != sizes[-1]:
            sizes.append(max_batch_size)
        return sizes


class CacheTransceiverConfig(StrictBaseModel):
    """llm_args.py's CacheTransceiverConfig (1.2): upper-case backends, an unbounded buffer, a
    timeout > 0; tests/unit/test_cache_transceiver_config.py holds what it accepts."""

    backend: Literal["DEFAULT", "UCX", "NIXL", "MPI", "MOONCAKE"] | None = None
    max_tokens_in_buffer: int | None = None
    kv_transfer_timeout_ms: int | None = Field(None, gt=0)
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


class LoraConfig(StrictBaseModel):
    """tensorrt_llm/lora_helper.py LoraConfig (a dataclass there: unknown keys are a TypeError)."""

    lora_dir: list[str] = []
    lora_ckpt_source: Literal["hf", "nemo"] = "hf"
    max_lora_rank: int = 64
    lora_target_modules: list[str] = []
    trtllm_modules_to_hf_modules: dict[str, str] = {}
    max_loras: int | None = None
    max_cpu_loras: int | None = None
    lora_weights_converters: list[str] = ["default"]


class _DecodingBase(StrictBaseModel):
    """llm_args.py `DecodingBaseConfig`: what every speculative config has."""

    max_draft_len: int | None = None
    max_total_draft_tokens: int | None = None
    speculative_model_dir: str | Path | None = None
    load_format: str | None = None


class MTPDecodingConfig(_DecodingBase):
    decoding_type: Literal["MTP"]
    num_nextn_predict_layers: int = 1
    use_relaxed_acceptance_for_thinking: bool = False
    relaxed_topk: int = 1
    relaxed_delta: float = 0.0
    use_mtp_vanilla: bool = False
    mtp_eagle_one_model: bool = True


class EagleDecodingConfig(_DecodingBase):
    decoding_type: Literal["Eagle", "Eagle3"]
    eagle_choices: list[list[int]] | None = None
    greedy_sampling: bool | None = True
    posterior_threshold: float | None = None
    use_dynamic_tree: bool | None = False
    dynamic_tree_max_topK: int | None = None
    num_eagle_layers: int | None = None
    max_non_leaves_per_layer: int | None = None
    eagle3_one_model: bool | None = True
    eagle3_layers_to_capture: list[int] | None = None
    eagle3_model_arch: Literal["llama3", "mistral_large3"] = "llama3"


class NGramDecodingConfig(_DecodingBase):
    decoding_type: Literal["NGram"]
    max_matching_ngram_size: int = 0
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True


class DraftTargetDecodingConfig(_DecodingBase):
    decoding_type: Literal["Draft_Target"]


SpeculativeConfig = Annotated[
    MTPDecodingConfig | EagleDecodingConfig | NGramDecodingConfig | DraftTargetDecodingConfig,
    Field(discriminator="decoding_type"),
]
"""`TorchLlmArgs.speculative_config`: `SpeculativeConfig` (a union keyed by `decoding_type`)."""


class KvCacheConnectorConfig(StrictBaseModel):
    connector_module: str
    connector_scheduler_class: str
    connector_worker_class: str


class TorchCompileConfig(StrictBaseModel):
    enable_fullgraph: bool = True
    enable_inductor: bool = False
    enable_piecewise_cuda_graph: bool = False
    capture_num_tokens: list[PositiveInt] | None = None
    enable_userbuffers: bool = True
    max_num_streams: PositiveInt = 1


NESTED_MODELS: dict[str, type[StrictBaseModel]] = {
    "kv_cache_config": KvCacheConfig,
    "scheduler_config": SchedulerConfig,
    "cuda_graph_config": CudaGraphConfig,
    "cache_transceiver_config": CacheTransceiverConfig,
    "moe_config": MoeConfig,
    "nvfp4_gemm_config": Nvfp4GemmConfig,
    "lora_config": LoraConfig,
    "kv_connector_config": KvCacheConnectorConfig,
    "torch_compile_config": TorchCompileConfig,
}


class AttentionDpConfig(StrictBaseModel):
    enable_balance: bool = False
    timeout_iters: int = 50
    batching_wait_iters: int = 10


class TorchLlmArgs(StrictBaseModel):
    """BaseLlmArgs + TorchLlmArgs (llmapi/llm_args.py, 1.2 period), field types as there.

    Validators that need a GPU (dtype) or load the tokenizer are not reproduced; the
    cuda-graph check that runs when the LLM is built is (`validate_cuda_graph_config`).
    Nested configs are the typed models above (`speculative_config` a union on `decoding_type`);
    `cp_config` is a plain dict upstream too; `peft_cache_config` and `sparse_attention_config`
    (PeftCacheConfig, the sparse attention union) are not modelled and stay dicts.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str | Path | None = None  # required upstream; LLM(model, ...) passes it apart
    tokenizer: str | Path | None = None
    tokenizer_mode: Literal["auto", "slow"] = "auto"
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    revision: str | None = None
    tokenizer_revision: str | None = None
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1
    gpus_per_node: int | None = None
    moe_cluster_parallel_size: int | None = None
    moe_tensor_parallel_size: int | None = None
    moe_expert_parallel_size: int | None = None
    enable_attention_dp: bool = False
    enable_lm_head_tp_in_adp: bool = False
    pp_partition: list[int] | None = None
    cp_config: dict[str, Any] | None = None
    load_format: str = "auto"  # TorchLlmArgs: Union[str, LoadFormat], upper-cased into the enum
    enable_lora: bool = False
    lora_config: LoraConfig | None = None
    peft_cache_config: dict[str, Any] | None = None
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    enable_chunked_prefill: bool = False
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = None
    batched_logits_processor: object | None = None
    iter_stats_max_iterations: int | None = None
    request_stats_max_iterations: int | None = None
    scheduler_config: SchedulerConfig = Field(default_factory=SchedulerConfig)
    cache_transceiver_config: CacheTransceiverConfig | None = None
    sparse_attention_config: dict[str, Any] | None = None
    speculative_config: SpeculativeConfig | None = None
    max_batch_size: int | None = None
    max_input_len: int | None = None
    max_seq_len: int | None = None
    max_beam_width: int | None = None
    max_num_tokens: int | None = 8192
    gather_generation_logits: bool = False
    num_postprocess_workers: int = 0
    postprocess_tokenizer_dir: str | None = None
    reasoning_parser: str | None = None
    otlp_traces_endpoint: str | None = None
    # BaseLlmArgs' in the 1.2 window: 1.2's commands/serve.py (get_llm_args) passes it to the
    # PyTorch LLM on every start; later versions moved it to TrtLlmArgs.
    fail_fast_on_attention_window_too_large: bool = False
    backend: str | None = None
    return_perf_metrics: bool = False
    orchestrator_type: Literal["rpc", "ray"] | None = None
    garbage_collection_gen0_threshold: int = 20000
    cuda_graph_config: CudaGraphConfig | None = Field(default_factory=CudaGraphConfig)
    attention_dp_config: AttentionDpConfig | None = None
    disable_overlap_scheduler: bool = False
    moe_config: MoeConfig = Field(default_factory=MoeConfig)
    attn_backend: str = "TRTLLM"
    sampler_type: str = "auto"
    enable_iter_perf_stats: bool = False
    enable_iter_req_stats: bool = False
    print_iter_log: bool = False
    perf_metrics_max_requests: int = 0
    batch_wait_timeout_ms: float = 0
    batch_wait_timeout_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0
    torch_compile_config: TorchCompileConfig | None = None
    enable_autotuner: bool = True
    enable_layerwise_nvtx_marker: bool = False
    enable_min_latency: bool = False
    stream_interval: int = 1
    force_dynamic_quantization: bool = False
    allreduce_strategy: (
        Literal[
            "AUTO", "NCCL", "UB", "MINLATENCY", "ONESHOT", "TWOSHOT", "LOWPRECISION", "MNNVL",
            "NCCL_SYMMETRIC",
        ]
        | None
    ) = "AUTO"  # fmt: skip
    checkpoint_loader: object | None = None
    checkpoint_format: str | None = None
    kv_connector_config: KvCacheConnectorConfig | None = None
    mm_encoder_only: bool = False
    ray_worker_extension_cls: str | None = None
    enable_sleep: bool = False
    max_stats_len: int = 1000
    nvfp4_gemm_config: Nvfp4GemmConfig | None = None

    @model_validator(mode="after")
    def _validate_cuda_graph_config(self) -> TorchLlmArgs:
        # TorchLlmArgs.validate_cuda_graph_config (1.2 period): batch_sizes and a non-zero
        # max_batch_size together must equal the generated list, else "Please don't set both".
        config = self.cuda_graph_config
        if config is None or not config.batch_sizes:
            return self
        sizes = sorted(config.batch_sizes)
        if config.max_batch_size and sizes != CudaGraphConfig.generated_batch_sizes(
            config.max_batch_size, config.enable_padding
        ):
            raise ValueError(
                "Please don't set both cuda_graph_config.batch_sizes and "
                "cuda_graph_config.max_batch_size."
            )
        return self


TORCH_LLM_ARGS = frozenset(TorchLlmArgs.model_fields)
"""Every `LLM(**kwargs)` key must be one of these (§1.2, §1.3). Not custom_tokenizer,
model_kwargs or env_overrides: the 1.2-window llm_args.py has none of them (the harsher reading
where versions differ; trtllm-serve gained --custom_tokenizer after 1.2)."""
