"""TensorRT-LLM's KV-cache event dicts -> engine/kv_events.py events, into the engine's log.

TensorRT-LLM 1.2 (`LLM.get_kv_cache_events_async`, serialized by KVCacheEventSerializer) sends
`{"event_id", "window_size", "data": {"type": ...}}` with data of type
- "created": a new cache (num_blocks_per_cache_level) -> AllBlocksCleared;
- "stored": `parent_hash` and `blocks: [{block_hash, tokens: [{token_id, ...}], lora_id?, ...}]`
  -> one BlockStored (hashes as signed 64-bit, as Dynamo's publisher converts them);
- "removed": `block_hashes` -> BlockRemoved;
- "updated": a block's priority or cache level changed -> nothing a router needs.
As Dynamo's publisher does, events of a window smaller than the largest one announced in the
"created" events (sliding-window layers) are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from trtllm_gateway.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvCacheEvent,
    KvEventLog,
    signed64,
)

logger = logging.getLogger(__name__)


class TrtllmKvEvents:
    """Converts and appends; one per engine. `window` is the largest attention window seen."""

    def __init__(self, kv_log: KvEventLog) -> None:
        self.log = kv_log
        self.window = 0

    def convert(self, raw: dict[str, Any]) -> KvCacheEvent | None:
        data = raw.get("data") or {}
        kind = data.get("type")
        window = int(raw.get("window_size") or 0)
        if kind == "created":
            levels = data.get("num_blocks_per_cache_level") or [0]
            self.log.num_blocks = max(self.log.num_blocks, int(levels[0]))
            self.window = max(self.window, window)
            return AllBlocksCleared()
        if window and window < self.window:
            return None
        if kind == "stored":
            blocks = data.get("blocks") or []
            if not blocks:
                return None
            tokens = [[int(t["token_id"]) for t in b.get("tokens") or []] for b in blocks]
            parent = data.get("parent_hash")
            self.log.block_size = len(tokens[0])
            return BlockStored(
                block_hashes=tuple(signed64(int(b["block_hash"])) for b in blocks),
                parent_block_hash=None if parent is None else signed64(int(parent)),
                token_ids=tuple(t for block in tokens for t in block),
                block_size=len(tokens[0]),
                lora_id=blocks[0].get("lora_id"),
            )
        if kind == "removed":
            return BlockRemoved(tuple(signed64(int(h)) for h in data.get("block_hashes") or ()))
        return None

    def feed(self, raw: dict[str, Any]) -> None:
        try:
            event = self.convert(raw)
        except (KeyError, TypeError, ValueError) as e:
            logger.warning("unreadable TensorRT-LLM KV event %r: %s", raw, e)
            return
        if event is not None:
            self.log.append(event)


def start_kv_feed(kv_log: KvEventLog, events: AsyncIterator[dict[str, Any]]) -> asyncio.Task[None]:
    """A task appending TensorRT-LLM's events to `kv_log` until cancelled (engine stop)."""
    feed = TrtllmKvEvents(kv_log)

    async def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            async for raw in events:
                feed.feed(raw)

    return asyncio.create_task(run(), name="trtllm-kv-feed")
