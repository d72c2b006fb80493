"""TrtllmConfig: what only --engine trtllm reads (parallelism, backends, LoRA, engine-args files).

config/engine_args.py maps them, with the EngineConfig, onto TensorRT-LLM LLM args."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TrtllmConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    trtllm_backend: Literal["pytorch", "autodeploy"] = Field(
        "pytorch", description="TensorRT-LLM backend (autodeploy drops args it cannot take)."
    )
    tensor_parallel_size: int = Field(1, ge=1, description="Tensor-parallel GPUs.")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline-parallel stages.")
    moe_expert_parallel_size: int | None = Field(None, ge=1, description="MoE EP (unset: auto).")
    enable_attention_dp: bool = Field(False, description="Attention data parallelism.")
    max_beam_width: int = Field(1, ge=1, description="Beam width the engine reserves for.")
    trust_remote_code: bool = Field(False, description="Allow model code from the model dir.")
    enable_chunked_prefill: bool = Field(
        False, description="Split long prompts across steps (trtllm: sent only if given)."
    )
    disable_overlap_scheduler: bool = Field(
        False, description="Turn off the overlap scheduler (always off in trtllm prefill mode)."
    )
    cuda_graph_batch_sizes: list[int] | None = Field(
        None, description="CUDA graph batch sizes (unset: TensorRT-LLM's own list)."
    )
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = Field(
        None,
        description="TensorRT-LLM's structured output backend (trtllm: needed for "
        "response_format; a Lark grammar needs llguidance).",
    )
    lora_modules: list[str] = Field(
        default_factory=list,
        description="LoRA adapters NAME=PATH (trtllm, aggregated mode): the request's model "
        "name selects one; /v1/models lists them; each is checked at start (adapter_config.json, "
        "rank <= max_lora_rank, weights). Comma list.",
    )
    enable_kv_events: bool = Field(False, description="Publish KV-cache events for routers.")
    cache_transceiver_backend: Literal["DEFAULT", "UCX", "NIXL", "MPI"] = Field(
        "DEFAULT", description="KV transfer backend in prefill/decode modes."
    )
    extra_engine_args: Path | None = Field(
        None, description="YAML of TensorRT-LLM LLM args, layered over the flags."
    )
    override_engine_args: str | None = Field(
        None, description="JSON object of LLM args, layered last (wins over everything)."
    )


def lora_module(entry: str) -> tuple[str, str]:
    """(name, path) of one --lora-modules entry; ValueError naming the entry if malformed."""
    name, sep, path = entry.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--lora-modules entry {entry!r} is not NAME=PATH")
    return name.strip(), path.strip()
