"""EmbeddingCache: byte-bounded LRU of image embeddings keyed by the image's content hash.

The engine's own (engine/ sits below multimodal/, so it cannot share multimodal.MediaCache); the
same shape: thread-safe, values read-only once cached. Namespace "vision/embeds" in logs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

NAMESPACE = "vision/embeds"


class EmbeddingCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, image_hash: str) -> torch.Tensor | None:
        with self._lock:
            value = self._entries.get(image_hash)
            if value is None:
                self.misses += 1
                return None
            self._entries.move_to_end(image_hash)
            self.hits += 1
            return value

    def put(self, image_hash: str, embeds: torch.Tensor) -> None:
        nbytes = embeds.numel() * embeds.element_size()
        if nbytes > self.capacity_bytes:
            return
        with self._lock:
            old = self._entries.pop(image_hash, None)
            if old is not None:
                self._bytes -= old.numel() * old.element_size()
            self._entries[image_hash] = embeds
            self._bytes += nbytes
            while self._bytes > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.numel() * evicted.element_size()

    def __len__(self) -> int:
        return len(self._entries)
