"""Validation of the TensorRT-LLM 1.2 `LLM(...)` arguments (PyTorch backend).

When `tensorrt_llm` is importable, the args are checked against `TorchLlmArgs` itself: every
key must be one of its fields, and each value is validated against that field's own type
(nested configs with their own validators, unknown nested keys included). TorchLlmArgs'
model-level validators are not run here: they need a GPU (dtype) and load the tokenizer, and
run anyway when the LLM is built. Without tensorrt_llm (CPU CI, `config check` on a laptop) the
hand-written strict schema below is the fallback; it mirrors 1.2's TorchLlmArgs (checked against
NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py of the 1.2 window and Dynamo's 1.2 configs;
where 1.3 differs, 1.2.0 is modelled: DynamicBatchConfig's fields required, no
scheduler_config.waiting_queue_policy, kv_transfer_timeout_ms > 0), and is stricter about types
(no "8" for 8). Either way errors are pydantic error dicts; config.engine_args turns
them into one-line messages.
"""

from __future__ import annotations

import importlib
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from trtllm_gateway.config.trtllm_autodeploy import AUTODEPLOY_OWN

AUTODEPLOY_UNSUPPORTED: tuple[str, ...] = (
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
)
"""LLM args the AutoDeploy backend rejects; they are dropped with one warning each."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class KvCacheConfig(StrictModel):
    enable_block_reuse: bool = True
    max_tokens: int | None = Field(None, ge=1)
    max_attention_window: list[Annotated[int, Field(ge=1)]] | None = Field(None, min_length=1)
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = Field(0.9, ge=0.0, le=1.0)
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: float | None = None
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = Field(0, ge=0)
    attention_dp_events_gather_period_ms: int = 5
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    max_gpu_total_bytes: int = Field(0, ge=0)
    dtype: str = "auto"
    mamba_ssm_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    tokens_per_block: int = Field(32, ge=1)


class DynamicBatchConfig(StrictModel):
    # 1.2: every field required (1.3 defaults them). Only the TensorRT backend uses it.
    enable_batch_size_tuning: bool
    enable_max_num_tokens_tuning: bool
    dynamic_batch_moving_average_window: int


class SchedulerConfig(StrictModel):
    capacity_scheduler_policy: Literal["MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"] = (
        "GUARANTEED_NO_EVICT"
    )
    context_chunking_policy: Literal["FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"] | None = None
    # Kept for the TensorRT backend; TensorRT-LLM's PyTorch backend ignores it.
    dynamic_batch_config: DynamicBatchConfig | None = None
    # No waiting_queue_policy: TensorRT-LLM 1.3 added it; 1.2 refuses the key (_HINTS).


class CudaGraphConfig(StrictModel):
    batch_sizes: list[int] | None = None
    max_batch_size: int = Field(0, ge=0)
    enable_padding: bool = False

    @model_validator(mode="after")
    def _not_both(self) -> CudaGraphConfig:
        # 1.2's TorchLlmArgs.validate_cuda_graph_config: with both set, batch_sizes must be
        # the very list max_batch_size generates ("Please don't set both").
        if (
            self.batch_sizes
            and self.max_batch_size
            and sorted(self.batch_sizes)
            != generated_cuda_graph_batch_sizes(self.max_batch_size, self.enable_padding)
        ):
            raise ValueError(
                "set batch_sizes or max_batch_size, not both (TensorRT-LLM 1.2 refuses both "
                "unless batch_sizes is the list max_batch_size generates)"
            )
        return self


def generated_cuda_graph_batch_sizes(max_batch_size: int, enable_padding: bool) -> list[int]:
    """The list 1.2's CudaGraphConfig generates from max_batch_size (llmapi/llm_args.py,
    CudaGraphConfig._generate_cuda_graph_batch_sizes): max_batch_size itself always last."""
    sizes = (
        [1, 2, 4, *(i * 8 for i in range(1, 17))] if enable_padding else [*range(1, 33), 64, 128]
    )
    sizes += [2**i for i in range(8, math.ceil(math.log2(max_batch_size)))]
    sizes = sorted(size for size in sizes if size <= max_batch_size)
    if sizes[-1] != max_batch_size:  # "Add max_batch_size if not already included"
        sizes.append(max_batch_size)
    return sizes


class CacheTransceiverConfig(StrictModel):
    """llm_args.py's CacheTransceiverConfig; max_tokens_in_buffer unbounded, as upstream."""

    backend: Literal["DEFAULT", "UCX", "NIXL", "MPI", "MOONCAKE"] | None = None
    max_tokens_in_buffer: int | None = None
    kv_transfer_timeout_ms: int | None = Field(None, gt=0)  # llm_args.py: gt=0
    kv_transfer_sender_future_timeout_ms: int | None = None


class MoeConfig(StrictModel):
    backend: Literal[
        "AUTO", "CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA", "TRITON"
    ] = "AUTO"
    max_num_tokens: int | None = None
    load_balancer: str | dict[str, Any] | None = None
    disable_finalize_fusion: bool = False
    use_low_precision_moe_combine: bool = False


Nvfp4Backend = Literal["cutlass", "cublaslt", "cutedsl", "cuda_core"]
_NVFP4_DEFAULT: tuple[Nvfp4Backend, ...] = ("cutlass", "cublaslt", "cuda_core")


class Nvfp4GemmConfig(StrictModel):
    allowed_backends: list[Nvfp4Backend] = Field(
        default_factory=lambda: list(_NVFP4_DEFAULT), min_length=1
    )


class AttentionDpConfig(StrictModel):
    enable_balance: bool = False
    timeout_iters: int = 50
    batching_wait_iters: int = 10


class _DecodingBase(StrictModel):
    max_draft_len: int | None = Field(None, ge=0)
    max_total_draft_tokens: int | None = None
    speculative_model_dir: str | None = None
    load_format: str | None = None


class MtpDecodingConfig(_DecodingBase):
    decoding_type: Literal["MTP"]
    num_nextn_predict_layers: int = Field(1, ge=1)
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
    MtpDecodingConfig | EagleDecodingConfig | NGramDecodingConfig | DraftTargetDecodingConfig,
    Field(discriminator="decoding_type"),
]


class LoraConfig(StrictModel):
    # tensorrt_llm/lora_helper.py (a dataclass: an unknown key is a TypeError there).
    lora_dir: list[str] = Field(default_factory=list)
    lora_ckpt_source: Literal["hf", "nemo"] = "hf"
    max_lora_rank: int = 64
    lora_target_modules: list[str] = Field(default_factory=list)
    trtllm_modules_to_hf_modules: dict[str, str] = Field(default_factory=dict)
    max_loras: int | None = None
    max_cpu_loras: int | None = None
    lora_weights_converters: list[str] = Field(default_factory=lambda: ["default"])


class KvConnectorConfig(StrictModel):
    connector_module: str
    connector_scheduler_class: str
    connector_worker_class: str


class TorchCompileConfig(StrictModel):
    enable_fullgraph: bool = True
    enable_inductor: bool = False
    enable_piecewise_cuda_graph: bool = False
    capture_num_tokens: list[Annotated[int, Field(ge=1)]] | None = None
    enable_userbuffers: bool = True
    max_num_streams: int = Field(1, ge=1)


class TrtllmArgs(StrictModel):
    """`tensorrt_llm.LLM(**kwargs)` for the PyTorch backend; every field optional in a YAML."""

    # The adapter fills these from the gateway's flags; a YAML may still set them.
    model: str | None = None
    tokenizer: str | None = None
    tokenizer_mode: Literal["auto", "slow"] = "auto"
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    dtype: str = "auto"
    revision: str | None = None
    tokenizer_revision: str | None = None
    # Not here: custom_tokenizer, model_kwargs, env_overrides (_HINTS).
    backend: Literal["pytorch", "autodeploy", "_autodeploy"] | None = None
    load_format: Literal["auto", "dummy", "AUTO", "DUMMY", "VISION_ONLY"] = "auto"

    # Parallelism.
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    context_parallel_size: int = Field(1, ge=1)
    gpus_per_node: int | None = None
    moe_cluster_parallel_size: int | None = None
    moe_tensor_parallel_size: int | None = None
    moe_expert_parallel_size: int | None = None
    enable_attention_dp: bool = False
    enable_lm_head_tp_in_adp: bool = False
    pp_partition: list[int] | None = None
    cp_config: dict[str, Any] | None = None
    attention_dp_config: AttentionDpConfig | None = None

    # Sizes.
    max_batch_size: int = Field(2048, ge=1)
    max_input_len: int = Field(1024, ge=1)
    max_seq_len: int | None = Field(None, ge=1)
    max_beam_width: int = Field(1, ge=1)
    max_num_tokens: int = Field(8192, ge=1)

    # Nested configs.
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    scheduler_config: SchedulerConfig = Field(default_factory=SchedulerConfig)
    cuda_graph_config: CudaGraphConfig | None = Field(default_factory=CudaGraphConfig)
    cache_transceiver_config: CacheTransceiverConfig | None = None
    moe_config: MoeConfig | None = None
    nvfp4_gemm_config: Nvfp4GemmConfig | None = None
    speculative_config: SpeculativeConfig | None = None
    lora_config: LoraConfig | None = None
    kv_connector_config: KvConnectorConfig | None = None
    torch_compile_config: TorchCompileConfig | None = None
    # Passed through as-is; TensorRT-LLM validates their inner keys at LLM construction.
    peft_cache_config: dict[str, Any] | None = None
    sparse_attention_config: dict[str, Any] | None = None

    # Features and scheduling.
    enable_lora: bool = False
    enable_chunked_prefill: bool = False
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = None
    disable_overlap_scheduler: bool = False
    attn_backend: str = "TRTLLM"
    sampler_type: Literal["TRTLLMSampler", "TorchSampler", "auto"] = "auto"
    stream_interval: int = Field(1, ge=1)
    batch_wait_timeout_ms: float = 0
    batch_wait_timeout_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0
    enable_autotuner: bool = True
    enable_layerwise_nvtx_marker: bool = False
    enable_min_latency: bool = False
    garbage_collection_gen0_threshold: int = 20000
    force_dynamic_quantization: bool = False
    allreduce_strategy: (
        Literal[
            "AUTO", "NCCL", "UB", "MINLATENCY", "ONESHOT", "TWOSHOT", "LOWPRECISION", "MNNVL",
            "NCCL_SYMMETRIC",
        ]
        | None
    ) = "AUTO"  # fmt: skip
    checkpoint_format: str | None = None
    mm_encoder_only: bool = False
    enable_sleep: bool = False
    orchestrator_type: Literal["rpc", "ray"] | None = None

    # Outputs, stats and logging.
    gather_generation_logits: bool = False
    num_postprocess_workers: int = Field(0, ge=0)
    postprocess_tokenizer_dir: str | None = None
    reasoning_parser: str | None = None
    return_perf_metrics: bool = False
    perf_metrics_max_requests: int = Field(0, ge=0)
    enable_iter_perf_stats: bool = False
    enable_iter_req_stats: bool = False
    iter_stats_max_iterations: int | None = None
    request_stats_max_iterations: int | None = None
    max_stats_len: int = 1000
    print_iter_log: bool = False
    otlp_traces_endpoint: str | None = None
    # BaseLlmArgs' in 1.2: 1.2's trtllm-serve (commands/serve.py, get_llm_args) passes it to
    # the PyTorch LLM on every start. Later versions moved it to TrtLlmArgs.
    fail_fast_on_attention_window_too_large: bool = False


_LATER = "unknown key in TensorRT-LLM 1.2's LLM arguments (a later version's); remove it"
_HINTS: dict[tuple[str, ...], str] = {
    ("scheduler_config", "waiting_queue_policy"): (
        "unknown key in TensorRT-LLM 1.2 (SchedulerConfig gained it in 1.3); remove it"
    ),
    # Not in the 1.2-window llm_args.py read for issue 39's audit (2026-11-28); trtllm-serve
    # gained --custom_tokenizer after 1.2. Where the versions are unclear, the harsher reading.
    ("custom_tokenizer",): _LATER,
    ("model_kwargs",): _LATER,
    ("env_overrides",): _LATER,
}
"""Keys a later TensorRT-LLM takes and 1.2 refuses: a clearer reason than "unknown key"."""


def trtllm_args_errors(args: dict[str, Any]) -> list[dict[str, Any]]:
    """Every problem with merged LLM args as pydantic error dicts (loc, type, msg); [] if none.

    TorchLlmArgs when tensorrt_llm imports (the AutoDeploy backend has its own args: the
    fallback schema with AutoDeploy's own keys let through, then engine/trtllm/llm_args.py's
    pruning, cover it), else the schema below.
    """
    errors = _errors(args)
    if args.get("backend") in ("autodeploy", "_autodeploy"):  # its own keys are not Torch's
        errors = [e for e in errors if not _autodeploy_own(e)]
    return [_with_hint(err) for err in errors]


def _autodeploy_own(err: dict[str, Any]) -> bool:
    loc = err["loc"]
    return err["type"] == "extra_forbidden" and len(loc) == 1 and loc[0] in AUTODEPLOY_OWN


def _with_hint(err: dict[str, Any]) -> dict[str, Any]:
    hint = _HINTS.get(tuple(str(p) for p in err["loc"]))
    return {**err, "type": "value_error", "msg": hint} if hint else err


def _errors(args: dict[str, Any]) -> list[dict[str, Any]]:
    library = _torch_llm_args(args)
    if library is not None:
        # Field types only; the one model-level rule a config file commonly breaks is added.
        errors = _field_errors(library, args)
        graphs = args.get("cuda_graph_config")
        if not errors and isinstance(graphs, dict):
            try:
                CudaGraphConfig.model_validate(graphs, strict=False)
            except ValidationError as exc:
                errors = [{**e, "loc": ("cuda_graph_config", *e["loc"])} for e in exc.errors()]
        return errors
    try:
        TrtllmArgs.model_validate(args)
    except ValidationError as exc:
        return [dict(err) for err in exc.errors()]
    return []


def validated_against(args: dict[str, Any]) -> str:
    """What trtllm_args_errors checks these args with, for `config check` output."""
    library = _torch_llm_args(args)
    if library is None:
        return "the built-in TensorRT-LLM 1.2 schema (tensorrt_llm is not importable)"
    return f"{library.__module__}.{library.__qualname__}"


def _torch_llm_args(args: dict[str, Any]) -> type[BaseModel] | None:
    if args.get("backend") in ("autodeploy", "_autodeploy"):
        return None
    try:
        module = importlib.import_module("tensorrt_llm.llmapi.llm_args")
    except ImportError:
        return None
    cls = getattr(module, "TorchLlmArgs", None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _field_errors(cls: type[BaseModel], args: dict[str, Any]) -> list[dict[str, Any]]:
    fields = cls.model_fields
    aliases = {f.alias: name for name, f in fields.items() if f.alias}
    errors: list[dict[str, Any]] = []
    for key, value in args.items():
        name = key if key in fields else aliases.get(key)
        if name is None:
            errors.append({"loc": (key,), "type": "extra_forbidden", "msg": "unknown key"})
            continue
        field = fields[name]
        try:
            # The field's own type (and constraints), without the model's validators.
            annotation: Any = field.annotation
            if field.metadata:
                annotation = Annotated[(annotation, *field.metadata)]
            adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        except Exception:  # a type pydantic cannot build a validator for: the key is known
            continue
        try:
            adapter.validate_python(value)
        except ValidationError as exc:
            errors += [{**err, "loc": (key, *err["loc"])} for err in exc.errors()]
    return errors
