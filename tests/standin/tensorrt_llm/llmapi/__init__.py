"""Stand-in `tensorrt_llm.llmapi` re-exports (§1.1)."""

from tensorrt_llm.disaggregated_params import DisaggregatedParams
from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.executor.result import CompletionOutput, RequestOutput
from tensorrt_llm.executor.utils import RequestError
from tensorrt_llm.llmapi.llm import LLM
from tensorrt_llm.llmapi.llm_args import (
    CacheTransceiverConfig,
    CapacitySchedulerPolicy,
    ContextChunkingPolicy,
    CudaGraphConfig,
    DynamicBatchConfig,
    KvCacheConfig,
    SchedulerConfig,
)
from tensorrt_llm.llmapi.mm_encoder import MultimodalEncoder
from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

__all__ = [
    "LLM",
    "CacheTransceiverConfig",
    "CapacitySchedulerPolicy",
    "CompletionOutput",
    "ContextChunkingPolicy",
    "CudaGraphConfig",
    "DisaggregatedParams",
    "DynamicBatchConfig",
    "GuidedDecodingParams",
    "KvCacheConfig",
    "LoRARequest",
    "MultimodalEncoder",
    "RequestError",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
]
