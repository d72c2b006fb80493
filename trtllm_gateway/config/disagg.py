"""DisaggConfig: disaggregation (prefill and encode siblings, KV routing, KV events, internal key).

EncodeSiblings is what an image embedder needs of it (a built-in core gets only that)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from trtllm_gateway.config.prefill_pools import parse_prefill_pools


class DisaggConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

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
        60.0,
        gt=0.0,
        description="Seconds for each call to a prefill sibling (its context phase, then the KV "
        "pull), the whole exchange: a sibling that never finishes answering is a failure.",
    )
    max_queued_prefill_tokens: int | None = Field(
        32768,
        ge=1,
        description="Prefill mode: prompt tokens of context phases in flight past which a new "
        "one is refused with 503 and the queue, so the decode side retries or prefills locally "
        "instead of timing out (null: no bound).",
    )
    busy_local_factor: float = Field(
        8.0,
        ge=0.0,
        description="Decode mode: prefill locally when every prefill sibling is busy (503) with "
        "more than this many times the prompt's uncached tokens queued; otherwise retry.",
    )
    remote_prefill_retries: int = Field(
        4,
        ge=0,
        description="Decode mode: retries of busy (503) prefill siblings before a prompt is "
        "prefilled locally; the waits double from 0.1 s, within the sibling's Retry-After.",
    )
    kv_transport: Literal["auto", "cuda_ipc", "shm", "http", "nixl"] = Field(
        "auto",
        description="How a decode instance takes the KV of a sibling's prefill (protocol v2): "
        "auto picks cuda_ipc when both instances are on GPUs of this host, shm on one host, "
        "else nixl when both have NIXL installed (the nixl extra), else http; a sibling "
        "without protocol v2 gets v1's blob (docs/disaggregation.md).",
    )
    sibling_backoff: float = Field(
        5.0, gt=0.0, description="Seconds a failed sibling is skipped before a /health recheck."
    )
    prefill_pools: str | None = Field(
        None, description="Prompt-length ranges to sibling groups: '0-2048=URL,URL;2048-=URL'."
    )
    kv_routing: bool = Field(
        True, description="With 2+ prefill siblings, prefer the one holding the longest prefix."
    )
    kv_routing_load_weight: float = Field(
        1.0, ge=0.0, description="Cost of a token queued at a sibling vs an uncached one."
    )
    encode_url: list[str] = Field(
        default_factory=list,
        description="Sibling encode instances (--mode encode) that embed images, comma list.",
    )
    encode_timeout: float = Field(
        30.0, gt=0.0, description="Seconds for a sibling to embed a request's images."
    )
    internal_api_key: SecretStr | None = Field(
        None,
        description="Key of the /internal/v1 sibling and router endpoints (prefill, KV, encode, "
        "KV events, load), which siblings present to each other; unset: those endpoints answer "
        "403. Client --api-key values never open them.",
    )
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

    @model_validator(mode="after")
    def _check_prefill_pools(self) -> DisaggConfig:
        if self.prefill_pools:
            parse_prefill_pools(self.prefill_pools, self.prefill_url)  # ValueError names the part
        return self


@dataclass(frozen=True, slots=True)
class EncodeSiblings:
    """The encode instances an image embedder calls, and the key it presents: all a built-in core
    gets of the DisaggConfig (it runs the embedder in its own process)."""

    urls: tuple[str, ...]
    timeout: float
    backoff: float
    internal_key: SecretStr | None


def encode_siblings(disagg: DisaggConfig) -> EncodeSiblings | None:
    """The encode siblings of --encode-url (None: images are encoded locally)."""
    if not disagg.encode_url:
        return None
    return EncodeSiblings(
        urls=tuple(disagg.encode_url),
        timeout=disagg.encode_timeout,
        backoff=disagg.sibling_backoff,
        internal_key=disagg.internal_api_key,
    )
