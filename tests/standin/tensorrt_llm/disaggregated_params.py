"""Stand-in `tensorrt_llm.disaggregated_params` with the 1.2-era fields (§4.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_REQUEST_TYPES = ("context_only", "generation_only", "context_and_generation")


@dataclass(slots=True, kw_only=True)
class DisaggregatedParams:
    request_type: str | None = None
    first_gen_tokens: list[int] | None = None
    ctx_request_id: int | None = None
    opaque_state: bytes | None = None
    draft_tokens: list[int] | None = None
    multimodal_embedding_handles: list[dict[str, Any]] | None = None
    multimodal_hashes: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if self.request_type is not None:
            self.request_type = self.request_type.lower()
            if self.request_type not in _REQUEST_TYPES:
                raise ValueError(f"Unknown request type: {self.request_type}")
        for h in self.multimodal_hashes or []:
            if len(h) != 8:
                raise ValueError("each multimodal hash must be 8 ints")
