"""Stand-in AutoDeploy LLM: rejects the args AutoDeploy's own LlmArgs does not take."""

from __future__ import annotations

from typing import Any

from tensorrt_llm.llmapi.llm import LLM as _TorchLLM

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


class LLM(_TorchLLM):
    def __init__(self, model: str, **kwargs: Any) -> None:
        bad = sorted(_UNSUPPORTED & kwargs.keys())
        if bad:
            raise ValueError(f"AutoDeploy LLM got unsupported arguments: {bad}")
        super().__init__(model, **kwargs)
