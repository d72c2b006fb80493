"""Merged LLM args (a plain dict) -> the LLM class and its keyword arguments.

The dict comes from config.engine_args (already layered and validated). Here the documented
config objects are built explicitly (SchedulerConfig, and DynamicBatchConfig from a YAML's
three keys, all required in 1.2: only the TensorRT backend reads it; KvCacheConfig,
CudaGraphConfig, CacheTransceiverConfig) and the backend picks the LLM class.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from trtllm_gateway.config.trtllm_autodeploy import AUTODEPLOY_ACCEPTS
from trtllm_gateway.config.trtllm_schema import AUTODEPLOY_UNSUPPORTED

logger = logging.getLogger(__name__)


def prune_for_autodeploy(args: dict[str, Any]) -> dict[str, Any]:
    """A copy without the args AutoDeploy rejects (its LlmArgs forbids every key it does not
    declare: config/trtllm_autodeploy.py); one warning per removed field. cuda_graph_config's
    batch sizes become AutoDeploy's own cuda_graph_batch_sizes."""
    pruned = dict(args)
    graphs = pruned.get("cuda_graph_config")
    if isinstance(graphs, dict) and graphs.get("batch_sizes"):
        pruned["cuda_graph_batch_sizes"] = sorted(graphs["batch_sizes"])
    for name in sorted(pruned.keys() - AUTODEPLOY_ACCEPTS | set(AUTODEPLOY_UNSUPPORTED)):
        if pruned.pop(name, None) is not None:
            logger.warning("`%s` cannot be used with the autodeploy backend; ignoring it", name)
    return pruned


def select_llm_class(backend: str) -> Any:
    """`tensorrt_llm.LLM` for pytorch, the AutoDeploy LLM for autodeploy."""
    if backend in ("autodeploy", "_autodeploy"):
        return importlib.import_module("tensorrt_llm._torch.auto_deploy").LLM
    return importlib.import_module("tensorrt_llm").LLM


def create_llm_kwargs(llmapi: Any, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(backend, kwargs for the LLM class) from validated merged args; args is not modified."""
    kwargs = dict(args)
    backend = str(kwargs.pop("backend", None) or "pytorch")
    if backend in ("autodeploy", "_autodeploy"):
        kwargs = prune_for_autodeploy(kwargs)
    _build_objects(llmapi, kwargs)
    return backend, kwargs


def _build_objects(llmapi: Any, kwargs: dict[str, Any]) -> None:
    sched = kwargs.get("scheduler_config")
    if isinstance(sched, dict):
        sched = dict(sched)
        dyn = sched.pop("dynamic_batch_config", None)
        policy = sched.pop("capacity_scheduler_policy", "GUARANTEED_NO_EVICT")
        kwargs["scheduler_config"] = llmapi.SchedulerConfig(
            capacity_scheduler_policy=llmapi.CapacitySchedulerPolicy(policy),
            # All three keys, which 1.2 requires (validated by config.trtllm_schema).
            dynamic_batch_config=llmapi.DynamicBatchConfig(**dyn) if dyn is not None else None,
            **sched,
        )
    for key, cls_name in (
        ("kv_cache_config", "KvCacheConfig"),
        ("cuda_graph_config", "CudaGraphConfig"),
        ("cache_transceiver_config", "CacheTransceiverConfig"),
    ):
        value = kwargs.get(key)
        if isinstance(value, dict):
            kwargs[key] = getattr(llmapi, cls_name)(**value)
    # Other nested dicts (speculative_config, moe_config, ...) are coerced by TensorRT-LLM.
