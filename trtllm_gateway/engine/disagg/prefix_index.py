"""PrefixIndex: what one sibling's prefix cache holds, rebuilt from its KV event stream.

Blocks are keyed by (parent hash, the block's token ids), so a prompt is matched without knowing
the sibling's hash function (the built-in engine's blake3 chain or TensorRT-LLM's): walk the
prompt's full blocks from the first, following each stored block's hash as the next parent,
until a block is unknown or was removed.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtllm_gateway.engine.kv_events.log import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvCacheEvent,
)

Key = tuple[int | None, tuple[int, ...]]


class _RankIndex:
    def __init__(self) -> None:
        self.hash_of: dict[Key, int] = {}
        self.key_of: dict[int, Key] = {}


class PrefixIndex:
    """Per attention-DP rank (each has its own cache); a prompt is matched against the best."""

    def __init__(self) -> None:
        self.block_size = 0
        self._ranks: dict[int, _RankIndex] = {}

    def __len__(self) -> int:
        return sum(len(r.key_of) for r in self._ranks.values())

    def clear(self) -> None:
        self._ranks.clear()

    def apply(self, event: KvCacheEvent) -> None:
        rank = self._ranks.setdefault(event.dp_rank, _RankIndex())
        if isinstance(event, AllBlocksCleared):
            self._ranks[event.dp_rank] = _RankIndex()
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                key = rank.key_of.pop(h, None)
                if key is not None and rank.hash_of.get(key) == h:
                    del rank.hash_of[key]
        elif isinstance(event, BlockStored):
            bs = event.block_size
            self.block_size = bs
            parent = event.parent_block_hash
            for i, h in enumerate(event.block_hashes):
                key = (parent, tuple(event.token_ids[i * bs : (i + 1) * bs]))
                rank.hash_of[key] = h
                rank.key_of[h] = key
                parent = h

    def cached_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        """Prompt tokens in leading full blocks this sibling holds on its best rank (0 before
        any event)."""
        return max((self._cached(r, prompt_token_ids) for r in self._ranks.values()), default=0)

    def _cached(self, rank: _RankIndex, prompt_token_ids: Sequence[int]) -> int:
        bs = self.block_size
        if bs <= 0:
            return 0
        parent: int | None = None
        n = 0
        for start in range(0, len(prompt_token_ids) - bs + 1, bs):
            h = rank.hash_of.get((parent, tuple(prompt_token_ids[start : start + bs])))
            if h is None:
                break
            parent = h
            n += bs
        return n
