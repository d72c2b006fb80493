"""ServerConfig: the HTTP server's own flags (bind, logs, limits, API keys, CORS, drain, traces).

Read by app/ only; none of it reaches an engine (a core process never sees the API keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import NoDecode


class ServerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind (0 picks a free one).")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of the gateway and uvicorn."
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="json: one JSON object per log line."
    )
    api_server_count: int | None = Field(
        None,
        ge=1,
        description="HTTP server processes on the one port, sharing one engine core (vLLM's "
        "flag). Default auto: on a GPU host one per 2 CPU cores, at most 8 (a 16-core host runs "
        "8), as one event loop cannot keep up with a GPU engine's tokens; 1 on a CPU device, on "
        "fewer than 8 cores, and where servers cannot share (--engine trtllm, "
        "--no-engine-process, --mode encode, --kv-events-zmq). More than 1 needs the built-in "
        "engine in its own process.",
    )
    shutdown_timeout: float = Field(
        30.0, ge=0.0, description="Seconds in-flight requests get to finish on SIGTERM."
    )
    startup_timeout: float = Field(
        3600.0,
        ge=0.0,
        description="Seconds the engine may take to become ready before the server exits with "
        "status 4 (0: wait for ever); what it waits on is logged every 30 s.",
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request line plus headers, in bytes; past it the connection gets "
        "400 and is closed before anything is parsed further.",
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
    api_key: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Accepted bearer keys (repeatable, or a comma list; env GATEWAY_API_KEY).",
    )
    api_key_file: Path | None = Field(None, description="File of API keys, one per line.")
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
    metrics_prefix: str = Field(
        "trtllm_gateway:",
        pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
        description="Prefix of the engine metrics on /metrics; 'vllm:' serves vLLM's own names, "
        "for vLLM's Grafana dashboards (deploy/grafana/).",
    )

    @field_validator("api_key", mode="before")
    @classmethod
    def _split_api_keys(cls, value: object) -> object:
        # GATEWAY_API_KEY=k1,k2 and --api-key k1,k2 both give two keys.
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value
