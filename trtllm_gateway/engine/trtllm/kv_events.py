"""TensorRT-LLM's KV-cache event dicts -> engine/kv_events/log.py events, into the engine's log.

TensorRT-LLM 1.2 (`LLM.get_kv_cache_events_async`, serialized by KVCacheEventSerializer) sends
`{"event_id", "window_size", "data": {"type": ...}}` with data of type
- "created": a new cache (num_blocks_per_cache_level) -> AllBlocksCleared;
- "stored": `parent_hash` and `blocks: [{block_hash, tokens: [{token_id, ...}], ...}]`
  -> one BlockStored of the full blocks (hashes as signed 64-bit, as Dynamo's publisher converts
  them); the run stops at its first partial block (fewer than tokens_per_block tokens), whose
  hash is remembered so that its later removal is not forwarded (Dynamo's publisher.py).
  No lora_id: 1.2's serializer leaves it out (tensorrt_llm/_utils.py
  `KVCacheEventSerializer._stored_block_to_json`: `# "lora_id": data.lora_id, # TODO`) and
  Dynamo's publisher sends none (its publish_stored's lora_id stays 0, i.e. null), so a block
  field some later version adds is not read either. The engine's own block hashes still differ
  per adapter (the C++ BlockKey holds the LoRA task id), but a router that keys blocks by their
  tokens sees an adapter's prompt and the base model's as the same prefix: KV-aware routing
  with --lora-modules conflates them (docs/trtllm.md).
- "removed": `block_hashes` -> BlockRemoved;
- `attention_dp_rank` (attention DP: one cache per rank) -> the events' dp_rank, counted from
  this instance's --data-parallel-rank.
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

from trtllm_gateway.engine.kv_events.log import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvCacheEvent,
    KvEventLog,
    signed64,
)

logger = logging.getLogger(__name__)


class TrtllmKvEvents:
    """Converts and appends; one per engine. `window` is the largest attention window seen;
    `block_size` is the engine's tokens_per_block (never read off an event)."""

    def __init__(self, kv_log: KvEventLog, block_size: int, rank_base: int = 0) -> None:
        self.log = kv_log
        self.rank_base = rank_base
        self.log.block_size = block_size
        self.block_size = block_size
        self.window = 0
        # Hashes of partial blocks left out of BlockStored: their removal is not forwarded.
        self.partial: set[int] = set()

    def convert(self, raw: dict[str, Any]) -> KvCacheEvent | None:
        data = raw.get("data") or {}
        kind = data.get("type")
        window = int(raw.get("window_size") or 0)
        rank = self.rank_base + int(raw.get("attention_dp_rank") or 0)
        if kind == "created":
            levels = data.get("num_blocks_per_cache_level") or [0]
            self.log.num_blocks = max(self.log.num_blocks, int(levels[0]))
            self.window = max(self.window, window)
            return AllBlocksCleared(dp_rank=rank)
        if window and window < self.window:
            return None
        if kind == "stored":
            return self._stored(data, rank)
        if kind == "removed":
            hashes = [signed64(int(h)) for h in data.get("block_hashes") or ()]
            kept = tuple(h for h in hashes if h not in self.partial)
            self.partial.difference_update(hashes)
            return BlockRemoved(kept, dp_rank=rank) if kept else None
        return None

    def _stored(self, data: dict[str, Any], rank: int) -> BlockStored | None:
        """Full blocks up to the first partial one (whose hash is remembered), as Dynamo's
        publisher does: a router's index holds full blocks of one size only."""
        hashes: list[int] = []
        tokens: list[int] = []
        for block in data.get("blocks") or []:
            ids = [int(t["token_id"]) for t in block.get("tokens") or []]
            h = signed64(int(block["block_hash"]))
            if len(ids) > self.block_size:
                raise ValueError(
                    f"a block of {len(ids)} tokens; tokens_per_block is {self.block_size}"
                )
            if len(ids) < self.block_size:
                self.partial.add(h)
                break
            hashes.append(h)
            tokens += ids
        if not hashes:
            return None
        parent = data.get("parent_hash")
        return BlockStored(
            block_hashes=tuple(hashes),
            parent_block_hash=None if parent is None else signed64(int(parent)),
            token_ids=tuple(tokens),
            block_size=self.block_size,
            lora_id=None,  # as the 1.2 serializer and Dynamo's publisher: see the docstring
            dp_rank=rank,
        )

    def feed(self, raw: dict[str, Any]) -> None:
        try:
            event = self.convert(raw)
        except (KeyError, TypeError, ValueError) as e:
            logger.warning("unreadable TensorRT-LLM KV event %r: %s", raw, e)
            return
        if event is not None:
            self.log.append(event)


def start_kv_feed(
    kv_log: KvEventLog, events: AsyncIterator[dict[str, Any]], block_size: int, rank_base: int = 0
) -> asyncio.Task[None]:
    """A task appending TensorRT-LLM's events to `kv_log` until cancelled (engine stop)."""
    feed = TrtllmKvEvents(kv_log, block_size, rank_base)

    async def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            async for raw in events:
                feed.feed(raw)

    return asyncio.create_task(run(), name="trtllm-kv-feed")
