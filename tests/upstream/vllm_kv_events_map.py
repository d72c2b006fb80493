"""vLLM's KV event structs as they are now: map-encoded (no array_like).

Transcribed from vllm-project/vllm vllm/distributed/kv_events.py @
0181ea3173e53eea8cf04a86891488e3dc89bb34 (EventBatch, KVCacheEvent, BlockStored, BlockRemoved,
AllBlocksCleared, KVEventBatch), field for field, with ExternalBlockHash from
vllm/v1/core/kv_cache_utils.py (`bytes | int`). The __hash__ methods are left out (no wire
effect). A payload decodes with `msgspec.msgpack.Decoder(type=KVEventBatch)`, as vLLM's own
tests and subscribers decode it.
"""

from __future__ import annotations

from typing import Any

import msgspec

ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


MEDIUM_GPU = "GPU"


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


END_SEQ = (-1).to_bytes(8, "big", signed=True)  # ZmqEventPublisher.END_SEQ
