"""The stand-in's KV block pool as its events show it: stored runs, partial blocks, eviction.

As the 1.2-period C++ KV cache manager reports through KVCacheEventManager
(cpp/tensorrt_llm/batch_manager/kvCacheEventManager.cpp) and `KVCacheEventSerializer`
(tensorrt_llm/_utils.py) serializes:
- a "created" event first (num_blocks_per_cache_level), once per attention-DP rank;
- "stored" runs whose parent_hash is the block they continue; the last block of a run may be
  PARTIAL (fewer than tokens_per_block tokens: enable_partial_reuse stores it), which is why
  Dynamo's publisher (ai-dynamo 0.8.1 dynamo/trtllm/publisher.py) stops a run at the first
  partial block and remembers its hash;
- "removed" when blocks are evicted (the pool is full), partial ones included;
- with attention DP each rank has its own pool and every event carries `attention_dp_rank`
  (gathered every attention_dp_events_gather_period_ms); without it the key is absent;
- a LoRA request's blocks hash with its task id (the C++ BlockKey holds `loraTaskId`), but a
  stored block carries no `lora_id`: 1.2's `KVCacheEventSerializer._stored_block_to_json` has
  `# "lora_id": data.lora_id, # TODO (shreyasm): enable serialization of lora_id`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

MASK = 0xFFFFFFFFFFFFFFFF


def block_hash(prefix: tuple[int, ...], lora_task_id: int | None = None) -> int:
    return hash(("kv", lora_task_id, prefix)) & MASK


class BlockPool:
    """One per LLM; `put` is the shared KV-event iterator's put."""

    def __init__(
        self,
        put: Callable[[dict[str, Any]], None],
        *,
        tokens_per_block: int,
        capacity: int,
        dp_size: int,
        attention_dp: bool,
    ) -> None:
        self._put = put
        self._size = tokens_per_block
        self._capacity = max(1, capacity)
        self._dp_size = dp_size
        self._attention_dp = attention_dp
        self._stored: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(dp_size)]
        self._created = [False] * dp_size
        self._event_id = 0

    def rank_for(self, request_id: int) -> int:
        """The attention-DP rank a request lands on (TensorRT-LLM balances; here round-robin)."""
        return request_id % self._dp_size

    def store(self, keyed: list[int], rank: int, lora_task_id: int | None = None) -> None:
        """Store the blocks of `keyed` (the prompt less its last token) on `rank`: the full
        blocks, then the trailing partial block if any; emit what is new."""
        size = self._size
        stored = self._stored[rank]
        if not self._created[rank]:
            self._created[rank] = True
            self._emit(rank, {"type": "created", "num_blocks_per_cache_level": [self._capacity, 0]})
        parent: int | None = None
        run: list[dict[str, Any]] = []
        run_parent: int | None = None
        for end in range(size, len(keyed) + size, size):
            prefix = tuple(keyed[: min(end, len(keyed))])
            if not prefix or (end > len(keyed) and len(prefix) == end - size):
                break
            h = block_hash(prefix, lora_task_id)
            if h in stored:
                stored.move_to_end(h)
            else:
                if not run:
                    run_parent = parent
                stored[h] = None
                tokens = prefix[end - size :]
                run.append(
                    {
                        "type": "stored_block",
                        "block_hash": h,
                        "tokens": [
                            {"type": "unique_token", "token_id": t, "token_extra_id": 0}
                            for t in tokens
                        ],
                        "cache_level": 0,
                        "priority": 35,
                    }
                )
            parent = h
        if run:
            self._emit(rank, {"type": "stored", "parent_hash": run_parent, "blocks": run})
        evicted = []
        while len(stored) > self._capacity:
            evicted.append(stored.popitem(last=False)[0])
        if evicted:
            self._emit(rank, {"type": "removed", "block_hashes": evicted})

    def _emit(self, rank: int, data: dict[str, Any]) -> None:
        event: dict[str, Any] = {
            "event_id": self._event_id,
            "data": data,
            "window_size": self._size * 1024,
        }
        if self._attention_dp:
            event["attention_dp_rank"] = rank
        self._event_id += 1
        self._put(event)
