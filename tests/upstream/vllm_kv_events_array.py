"""vLLM's KV event structs as first released: array_like (each struct a msgpack array).

Transcribed from vllm-project/vllm vllm/distributed/kv_events.py @
b4e69e0af33f4698e157a262cc787fe61983cd3d, field for field. msgspec decodes an array with more
elements than an array_like struct has fields by skipping the extra ones, which is how readers
built on these structs read the later fields (medium, lora_name, data_parallel_rank ...).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import msgspec


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]  # noqa: UP045 (as upstream wrote it)
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]  # noqa: UP045


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]  # noqa: UP007
