"""MediaCache: byte-bounded LRU keyed by (namespace, content hash): pixels now, embeddings later.

Values are shared between requests: whoever reads one must treat it as read-only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    value: object
    nbytes: int


class MediaCache:
    """Least-recently-used eviction once the summed nbytes pass capacity_bytes (0 disables it).

    Thread-safe, so an encoder thread may share it with the event loop.
    """

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, namespace: str, key: str) -> object | None:
        with self._lock:
            entry = self._entries.get((namespace, key))
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end((namespace, key))
            self.hits += 1
            return entry.value

    def put(self, namespace: str, key: str, value: object, nbytes: int) -> None:
        """Insert or refresh; a value larger than the whole capacity is not kept."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        with self._lock:
            old = self._entries.pop((namespace, key), None)
            if old is not None:
                self._bytes -= old.nbytes
            if nbytes > self.capacity_bytes:
                return
            self._entries[(namespace, key)] = _Entry(value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item: tuple[str, str]) -> bool:
        return item in self._entries
