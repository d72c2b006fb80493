"""The payloads --kv-events-zmq sends, in the format of the publisher each router reads.

dynamo      NVIDIA Dynamo's TensorRT-LLM publisher (ai-dynamo/dynamo
            components/src/dynamo/trtllm/publisher.py @ 0d38568995b5, ZmqKvEventPublisher):
            one event per message, msgpack `[ts, [event], data_parallel_rank]`, the event a map
            in the key order it builds: BlockStored `type, block_hashes, parent_block_hash,
            token_ids, block_size, lora_id, block_mm_infos` (hashes signed 64-bit; lora_id null
            unless set; block_mm_infos one entry per block, null or `{"mm_objects": [{"mm_hash":
            u64, "offsets": []}]}` with mm_hash the first 16 hex digits of the image hash, as it
            reads TensorRT-LLM's mm_keys); BlockRemoved `type, block_hashes`; AllBlocksCleared
            `type`.
vllm        vLLM's ZmqEventPublisher payload (vllm-project/vllm vllm/distributed/kv_events.py
            @ 0181ea3173e5: KVEventBatch, msgspec, omit_defaults, no array_like): a map `ts,
            events, data_parallel_rank`, one batch per publish (vLLM: per scheduler step), events
            maps tagged by "type": BlockStored `block_hashes, parent_block_hash, token_ids,
            block_size, lora_id, medium, lora_name, extra_keys` (hashes unsigned 64-bit ints, vLLM's
            default VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1; medium "GPU"; extra_keys one entry
            per block, null or `[[mm_hash, offset], ...]` as vLLM's block pool fills it);
            BlockRemoved `block_hashes, medium`; AllBlocksCleared.
vllm-array  the same structs with msgspec array_like=True, the layout of vLLM's releases before the
            map encoding (vllm @ b4e69e0af33f and examples/online_serving/kv_events_subscriber.py
            @ 0ef0f42653bc decode it: msgspec skips trailing elements they lack), which is also
            the only batch layout Dynamo's Rust ZMQ listener reads.
"""

from __future__ import annotations

import string
from typing import Any, Literal

import msgspec
from blake3 import blake3

from trtllm_gateway.engine.kv_events.log import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventRecord,
    MmSpan,
)

KvEventsFormat = Literal["dynamo", "vllm", "vllm-array"]
MEDIUM_GPU = "GPU"  # vLLM's MEDIUM_GPU: the built-in engine's cache is its device memory


def unsigned64(h: int) -> int:
    """A signed 64-bit hash (the log's) as vLLM's int block hashes carry it, unsigned."""
    return h & ((1 << 64) - 1)


def mm_hash_u64(identity: str) -> int:
    """Dynamo's mm_hash of an image: the first 16 hex digits of its hash (publisher.py:
    `int(mm_key["hash"][:16], 16)`); an identity with no hex digest is hashed first."""
    digest = identity.rsplit("-", 1)[-1]
    if len(digest) < 16 or any(c not in string.hexdigits for c in digest[:16]):
        digest = blake3(identity.encode()).hexdigest()
    return int(digest[:16], 16)


# --- vLLM: its structs, field for field (both layouts share them) ---------------------------
class _VllmMap(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _VllmArray(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


def _vllm_event_types(base: type[msgspec.Struct]) -> tuple[type[Any], type[Any], type[Any]]:
    class BlockStoredV(base, tag="BlockStored"):  # type: ignore[valid-type,misc,call-arg]
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[list[tuple[str, int]] | None] | None = None

    class BlockRemovedV(base, tag="BlockRemoved"):  # type: ignore[valid-type,misc,call-arg]
        block_hashes: list[int]
        medium: str | None

    class AllBlocksClearedV(base, tag="AllBlocksCleared"):  # type: ignore[valid-type,misc,call-arg]
        pass

    return BlockStoredV, BlockRemovedV, AllBlocksClearedV


_MAP_EVENTS = _vllm_event_types(_VllmMap)
_ARRAY_EVENTS = _vllm_event_types(_VllmArray)


class _VllmBatchMap(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _VllmBatchArray(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


def _extra_keys(ev: BlockStored) -> list[list[tuple[str, int]] | None]:
    """One entry per block (vLLM's block pool appends one per cached block): None, or the
    (image identity, offset from the block's first token) pairs its hash mixed in."""
    per_block = ev.block_mm or ((),) * len(ev.block_hashes)
    return [[(m.mm_hash, m.offset) for m in spans] or None for spans in per_block]


def _vllm_event(rec: KvEventRecord, array: bool) -> Any:
    stored, removed, cleared = _ARRAY_EVENTS if array else _MAP_EVENTS
    ev = rec.event
    if isinstance(ev, BlockStored):
        parent = ev.parent_block_hash
        return stored(
            block_hashes=[unsigned64(h) for h in ev.block_hashes],
            parent_block_hash=None if parent is None else unsigned64(parent),
            token_ids=list(ev.token_ids),
            block_size=ev.block_size,
            lora_id=ev.lora_id,
            medium=MEDIUM_GPU,
            lora_name=None,
            extra_keys=_extra_keys(ev),
        )
    if isinstance(ev, BlockRemoved):
        return removed(block_hashes=[unsigned64(h) for h in ev.block_hashes], medium=MEDIUM_GPU)
    assert isinstance(ev, AllBlocksCleared)
    return cleared()


def vllm_payload(records: list[KvEventRecord], rank: int, array: bool) -> bytes:
    """One vLLM batch of records of one data-parallel rank; ts is the batch's (vLLM: the
    step's time.time())."""
    batch = _VllmBatchArray if array else _VllmBatchMap
    events = [_vllm_event(r, array) for r in records]
    return msgspec.msgpack.encode(batch(records[-1].ts, events, rank))


# --- Dynamo: the dicts its TensorRT-LLM publisher builds, in its key order -------------------
def _mm_infos(spans: tuple[MmSpan, ...]) -> dict[str, Any] | None:
    objects = [{"mm_hash": mm_hash_u64(m.mm_hash), "offsets": []} for m in spans]
    return {"mm_objects": objects} if objects else None


def dynamo_event(rec: KvEventRecord) -> dict[str, Any]:
    ev = rec.event
    if isinstance(ev, BlockStored):
        per_block = ev.block_mm or ((),) * len(ev.block_hashes)
        return {
            "type": "BlockStored",
            "block_hashes": list(ev.block_hashes),
            "parent_block_hash": ev.parent_block_hash,
            "token_ids": list(ev.token_ids),
            "block_size": ev.block_size,
            "lora_id": ev.lora_id if ev.lora_id else None,  # its `lora_id if lora_id != 0`
            "block_mm_infos": [_mm_infos(spans) for spans in per_block],
        }
    if isinstance(ev, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(ev.block_hashes)}
    return {"type": "AllBlocksCleared"}


def dynamo_payload(rec: KvEventRecord) -> bytes:
    """One event's message payload, `[ts, [event], data_parallel_rank]` (float64 ts, as
    msgpack.packb(use_bin_type=True) packs a Python float)."""
    return msgspec.msgpack.encode([rec.ts, [dynamo_event(rec)], rec.event.dp_rank])
