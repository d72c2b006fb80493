"""PrefixIndex: what one sibling's prefix cache holds, rebuilt from its KV event stream.

Blocks are keyed by (parent hash, the block's token ids), so a prompt is matched without knowing
the sibling's hash function (the built-in engine's blake3 chain or TensorRT-LLM's): walk the
prompt's full blocks from the first, following each stored block's hash as the next parent,
until a block is unknown or was removed.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtllm_gateway.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvCacheEvent,
)

Key = tuple[int | None, tuple[int, ...]]


class PrefixIndex:
    def __init__(self) -> None:
        self.block_size = 0
        self._hash_of: dict[Key, int] = {}
        self._key_of: dict[int, Key] = {}

    def __len__(self) -> int:
        return len(self._key_of)

    def clear(self) -> None:
        self._hash_of.clear()
        self._key_of.clear()

    def apply(self, event: KvCacheEvent) -> None:
        if isinstance(event, AllBlocksCleared):
            self.clear()
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                key = self._key_of.pop(h, None)
                if key is not None and self._hash_of.get(key) == h:
                    del self._hash_of[key]
        elif isinstance(event, BlockStored):
            bs = event.block_size
            self.block_size = bs
            parent = event.parent_block_hash
            for i, h in enumerate(event.block_hashes):
                key = (parent, tuple(event.token_ids[i * bs : (i + 1) * bs]))
                self._hash_of[key] = h
                self._key_of[h] = key
                parent = h

    def cached_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        """Prompt tokens in leading full blocks this sibling holds (0 before any event)."""
        bs = self.block_size
        if bs <= 0:
            return 0
        parent: int | None = None
        n = 0
        for start in range(0, len(prompt_token_ids) - bs + 1, bs):
            h = self._hash_of.get((parent, tuple(prompt_token_ids[start : start + bs])))
            if h is None:
                break
            parent = h
            n += bs
        return n
