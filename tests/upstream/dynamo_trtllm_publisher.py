"""What NVIDIA Dynamo's TensorRT-LLM publisher sends for a stored, removed or cleared run of blocks.

Transcribed from ai-dynamo/dynamo components/src/dynamo/trtllm/publisher.py @
0d38568995b54b8acc3a93f48452c4b7fccb6be0: ZmqKvEventPublisher.publish_stored, publish_removed,
publish_all_cleared and _publish_event (the event dicts in their key order, `[timestamp, [event],
attention_dp_rank]` packed by `msgpack.packb(batch, use_bin_type=True)`), and the block_mm_infos
Publisher._handle_kv_event builds from TensorRT-LLM's mm_keys (`int(hash[:16], 16)`, offsets []).
Block hashes go through its _to_signed_i64.
"""

from __future__ import annotations

from typing import Any

import msgpack


def to_signed_i64(value: int | None) -> int | None:
    if value is None:
        return None
    if value >= 2**63:
        return value - 2**64
    if value < -(2**63):
        return ((value + 2**63) % 2**64) - 2**63
    return value


def mm_infos(mm_key_hashes: list[str]) -> dict[str, Any] | None:
    """One block's entry of block_mm_infos from its mm_keys' hex hashes."""
    mm_hashes = [int(h[:16], 16) for h in mm_key_hashes if h]
    if not mm_hashes:
        return None
    return {"mm_objects": [{"mm_hash": h, "offsets": []} for h in mm_hashes]}


def stored_event(
    token_ids: list[int],
    block_hashes: list[int],
    kv_block_size: int,
    lora_id: int = 0,
    parent_hash: int | None = None,
    block_mm_infos: list[dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": [to_signed_i64(h) for h in block_hashes],
        "parent_block_hash": to_signed_i64(parent_hash) if parent_hash is not None else None,
        "token_ids": token_ids,
        "block_size": kv_block_size,
        "lora_id": lora_id if lora_id != 0 else None,
    }
    if block_mm_infos is not None:
        event["block_mm_infos"] = block_mm_infos
    return event


def removed_event(block_hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [to_signed_i64(h) for h in block_hashes]}


def all_cleared_event() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def payload(timestamp: float, event: dict[str, Any], attention_dp_rank: int = 0) -> bytes:
    return bytes(msgpack.packb([timestamp, [event], attention_dp_rank], use_bin_type=True))
